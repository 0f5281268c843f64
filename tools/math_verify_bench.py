#!/usr/bin/env python3
"""math-verify's side of `temper bench grade`: grades the (gold, pred) pairs of a JSONL file
(tools/grader_cases.py's layout) with math-verify, single-threaded, and prints
{"pairs": N, "seconds": S, "accepted": K}. Parsing is timed with verification, as temper's is.

Usage: .venv/bin/python tools/math_verify_bench.py CASES.jsonl
"""
import json
import sys
import time

from math_verify import parse, verify


def wrap(s):
    return s if ("$" in s or "\\boxed" in s) else f"${s}$"


pairs = [json.loads(l) for l in open(sys.argv[1])]
t = time.perf_counter()
accepted = sum(bool(verify(parse(wrap(p["gold"])), parse(wrap(p["pred"])))) for p in pairs)
print(json.dumps({"pairs": len(pairs), "seconds": time.perf_counter() - t, "accepted": accepted}))
