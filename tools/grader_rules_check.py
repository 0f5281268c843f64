#!/usr/bin/env python3
"""The expected verdicts in crates/temper-reward/tests/grader_rules.rs (and its modules in
grader_rules/) are math-verify 0.9.0's.

The hand-written pairs of those files (`("gold", "pred", bool)` inside `check(&[...])`) were chosen
by people to cover the grader's rules, but their verdicts are not ours to choose: this script
computes math-verify's verdict on every pair, exactly as the test hands the pair to temper (a text
with no math markup is put inside `$..$`, as tools/grader_cases.py does), with
`verify(parse(gold), parse(pred))`, and reports each expectation that differs. With `--fix` it
rewrites those expectations to math-verify's verdict.

Usage: .venv/bin/python tools/grader_rules_check.py [--fix]
"""
import re
import sys
from pathlib import Path

from math_verify import parse, verify

ROOT = Path(__file__).resolve().parent.parent / "crates/temper-reward/tests"
PATHS = [ROOT / "grader_rules.rs", *sorted((ROOT / "grader_rules").glob("*.rs"))]

LIT = r'(?:r#"(?:.|\n)*?"#|r"[^"]*"|"(?:[^"\\]|\\.)*")'
TUPLE = re.compile(rf"\(\s*({LIT})\s*,\s*({LIT})\s*,\s*(true|false)(\s*,?\s*)\)")


def unrust(lit):
    if lit.startswith('r#"'):
        return lit[3:-2]
    if lit.startswith('r"'):
        return lit[2:-1]
    body = lit[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            n = body[i + 1]
            if n == "u":
                j = body.index("}", i)
                out.append(chr(int(body[i + 3 : j], 16)))
                i = j + 1
                continue
            out.append({"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}[n])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def has_markup(s):
    return any(m in s for m in ["$", "\\(", "\\[", "\\boxed", "\\fbox"])


def is_prose(s):
    """Words outside LaTeX commands and \\text{} groups (four letters or more in a row)."""
    bare = re.sub(r"\\(?:text|begin|end)\{[^}]*\}|\\[A-Za-z]+", " ", s)
    return re.search(r"[A-Za-z]{4,}", bare) is not None


def wrap(s):
    """A bare answer is an answer in math mode; prose is handed over as it is."""
    return s if has_markup(s) or is_prose(s) else f"${s}$"


def main():
    fix = "--fix" in sys.argv
    wrong, rewritten = [], {}

    def judge(m):
        gold, pred = unrust(m.group(1)), unrust(m.group(2))
        want = m.group(3) == "true"
        mv = bool(verify(parse(wrap(gold)), parse(wrap(pred))))
        if mv != want:
            wrong.append((gold, pred, want, mv))
            if fix:
                return f"({m.group(1)}, {m.group(2)}, {'true' if mv else 'false'}{m.group(4)})"
        return m.group(0)

    for path in PATHS:
        before = len(wrong)
        new = TUPLE.sub(judge, path.read_text())
        if len(wrong) > before:
            rewritten[path] = new
    for gold, pred, want, mv in wrong:
        print(f"{gold!r} vs {pred!r}: file says {want}, math-verify says {mv}")
    print(f"{len(wrong)} expectations differ from math-verify")
    if fix:
        for path, new in rewritten.items():
            path.write_text(new)
    sys.exit(1 if wrong and not fix else 0)


if __name__ == "__main__":
    main()
