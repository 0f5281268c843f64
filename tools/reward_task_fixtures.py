#!/usr/bin/env python3
"""Regenerate crates/temper-reward/tests/fixtures/tasks.jsonl.

Runs the Rust generator (examples/dump_tasks.rs), then checks every example independently in
Python: arithmetic answers with Python's own evaluation of the expression, chain sums by reading
the prompt's words, countdown by evaluating the stored solution and checking it uses exactly the
given numbers. Only examples that pass are written; any failure aborts.
"""
import json, os, re, subprocess, sys
from fractions import Fraction

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(root, "target", "reward-only"))
out = subprocess.run(["cargo", "run", "-q", "-p", "temper-reward", "--example", "dump_tasks"],
                     cwd=root, env=env, check=True, capture_output=True, text=True).stdout


def exact_eval(expr):
    # Python's parser with every literal as an exact Fraction.
    return eval(re.sub(r"(\d+)", r"Fraction(\1)", expr), {"Fraction": Fraction})


lines = []
for line in out.splitlines():
    ex = json.loads(line)
    t, meta, ans = ex["task"], ex["metadata"], ex["answer"]
    if t == "arith":
        expr = meta["expr"]
        assert expr in ex["prompt"], ex
        v = exact_eval(expr)
        assert v.denominator == 1 and str(v.numerator) == ans, (ex, v)
        if ex["opts"].get("allow_negative") is False:
            assert v >= 0, ex
        digits = ex["opts"].get("digits", 1)
        toks = expr.split(" ")
        for k in range(0, len(toks), 2):
            dividend = k + 1 < len(toks) and toks[k + 1] == "/"
            assert len(toks[k]) == digits or dividend, (ex, toks[k])
    elif t == "chain_sum":
        m = re.match(r"Start with (\d+)\. (.*) What number", ex["prompt"])
        total = int(m.group(1))
        for op, n in re.findall(r"(Add|Subtract) (\d+)\.", m.group(2)):
            total += int(n) if op == "Add" else -int(n)
        assert str(total) == ans, ex
    elif t == "countdown":
        sol, nums = meta["solution"], meta["numbers"]
        assert exact_eval(sol) == int(ans) == meta["target"], ex
        assert sorted(int(n) for n in re.findall(r"\d+", sol)) == sorted(nums), ex
        assert str(nums).replace(" ", "") in ex["prompt"].replace(" ", ""), ex
    else:
        sys.exit(f"unknown task {t}")
    lines.append(json.dumps(ex, sort_keys=True))

path = os.path.join(root, "crates", "temper-reward", "tests", "fixtures", "tasks.jsonl")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"wrote {len(lines)} checked examples to {path}")
