#!/usr/bin/env python3
"""A small real-prose article set for the summary task, offline: the documentation topics that ship
with Python (`pydoc_data.topics`), one article per topic, cleaned to plain paragraphs.

Usage: python3 tools/make_articles.py OUT.jsonl [--count 64] [--min-chars 800] [--max-chars 2500]
Each line: {"id": topic, "article": text} (CNN/DailyMail's `article` field).
"""
import argparse
import json
import re

from pydoc_data.topics import topics


def clean(text):
    # Drop code blocks and reST markup; keep prose paragraphs.
    paras = []
    for p in re.split(r"\n\s*\n", text):
        lines = [l for l in p.splitlines() if l.strip()]
        if not lines or any(l.startswith("   ") for l in lines) or p.strip().startswith((">>>", "*", "+", "|")):
            continue
        s = " ".join(l.strip() for l in lines)
        s = re.sub(r"[*`]+", "", s)
        if len(s) > 80 and s[-1] in ".:)":
            paras.append(s)
    return "\n\n".join(paras)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--min-chars", type=int, default=800)
    ap.add_argument("--max-chars", type=int, default=2500)
    a = ap.parse_args()
    n = 0
    with open(a.out, "w") as f:
        for name in sorted(topics):
            text = clean(topics[name])
            if len(text) < a.min_chars:
                continue
            text = text[: a.max_chars]
            text = text[: text.rfind(".") + 1]
            f.write(json.dumps({"id": name, "article": text}) + "\n")
            n += 1
            if n == a.count:
                break
    print(f"{n} articles -> {a.out}")


if __name__ == "__main__":
    main()
