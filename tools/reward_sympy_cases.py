#!/usr/bin/env python3
"""Regenerate crates/temper-reward/tests/fixtures/sympy_cases.jsonl: an independent reference for
the grader's expression engine.

Random expressions are built in sympy and written in the forms answers come in: sympy's LaTeX,
sympy's plain text (with ^ for powers), and expanded / factored / combined rewrites. Each pair
(gold, pred) is labelled equal or not by sympy itself (simplify(gold - pred) == 0), with wrong
rewrites (off by one, a factor of two, a swapped variable, a sign) mixed in.
"""
import json, os, random
import sympy as sp

random.seed(20260)
x, y = sp.symbols("x y")
VARS = [x, y]


def atom():
    r = random.random()
    if r < 0.35:
        return random.choice(VARS)
    if r < 0.6:
        return sp.Integer(random.randint(1, 9))
    if r < 0.75:
        return sp.Rational(random.randint(1, 9), random.randint(2, 9))
    if r < 0.85:
        return sp.sqrt(random.choice([2, 3, 5, 6, 7, 8, 12]))
    return sp.pi


def expr(depth):
    if depth == 0:
        return atom()
    r = random.random()
    a, b = expr(depth - 1), expr(depth - 1)
    if r < 0.3:
        return a + b
    if r < 0.5:
        return a - b
    if r < 0.7:
        return a * b
    if r < 0.8:
        return a / (b + random.randint(1, 3)) if b.is_positive is not False else a / 2
    if r < 0.9:
        return a ** random.randint(2, 3)
    f = random.choice([sp.sin, sp.cos, sp.exp, sp.sqrt])
    return f(a)


def plain(e):
    return sp.sstr(e).replace("**", "^").replace("E", "e")


rows = []
seen = set()
while len(rows) < 400:
    e = expr(random.randint(1, 3))
    if e.is_number and not e.free_symbols and e == 0:
        continue
    gold = sp.latex(e)
    preds = [sp.latex(sp.expand(e)), plain(e), sp.latex(sp.factor(e)), sp.latex(sp.together(e))]
    wrong = [e + 1, 2 * e, e.subs({x: y, y: x}, simultaneous=True), -e]
    for p in preds[: random.randint(1, 3)]:
        key = (gold, p)
        if key not in seen:
            seen.add(key)
            rows.append({"gold": gold, "pred": p, "equal": True})
    w = random.choice(wrong)
    same = sp.simplify(e - w) == 0
    p = random.choice([sp.latex(w), plain(w)])
    if (gold, p) not in seen:
        seen.add((gold, p))
        rows.append({"gold": gold, "pred": p, "equal": bool(same)})

# Rewrites by expand/factor/together are equal by construction; wrong ones are labelled by simplify.
path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "crates", "temper-reward", "tests", "fixtures", "sympy_cases.jsonl")
with open(path, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(f"wrote {len(rows)} cases ({sum(r['equal'] for r in rows)} equal) to {path}")
