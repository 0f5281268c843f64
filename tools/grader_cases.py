#!/usr/bin/env python3
"""Independent (gold, prediction) cases for temper's math grader, one set per family of the grader
issue, each labelled by math-verify (pinned in scripts/setup-env.sh) and by sympy.

The generator builds every pair from values it knows (seeded; fractions as sympy Rationals), either
the same values written two ways or with one value changed, so besides math-verify's verdict each
pair carries the construction's own verdict (`sympy`): an answer to "are these the same answer?"
that does not depend on any parser. Malformed answers (math split across lines inside $..$, a
renamed variable) are unequal by construction.

Usage: .venv/bin/python tools/grader_cases.py OUT.jsonl [--per-family 400] [--seed 0]
Each line: {"family", "gold", "pred", "math_verify": bool, "sympy": bool}.
"""
import argparse
import json
import random
import signal

import sympy as sp
from math_verify import parse, verify


def frac_tex(q):
    q = sp.Rational(q)
    if q.q == 1:
        return str(q.p)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.p)}}}{{{q.q}}}"


def num(rng, lo=-20, hi=20):
    return rng.randint(lo, hi)


def other(rng, v, lo=-20, hi=20):
    w = v
    while w == v:
        w = rng.randint(lo, hi)
    return w


def labels(rng):
    a, b = num(rng), num(rng)
    same = rng.random() < 0.5
    c, d = (a, b) if same else (a, other(rng, b))
    kind = rng.randrange(4)
    if kind == 0:
        return f"({a},{b})", f"(p,q)=({c},{d})", same
    if kind == 1:
        a, b, c = abs(a) + 1, abs(b) + 1, abs(c) + 1
        d = abs(d) + 1
        return f"{a}, {b}", f"AB={c}, CD={d}", same
    if kind == 2:
        a, b = abs(a) + 1, abs(b) + 1
        c, d = abs(c) + 1, abs(d) + 1
        return f"{a}:{b}", f"V_1:V_2={c}:{d}", same
    return f"{a}", f"f(x)={c}", same


def intervals(rng):
    a = num(rng, -10, 0)
    b = num(rng, 1, 10)
    same = rng.random() < 0.5
    c, d = (a, b) if same else (a, other(rng, b, 1, 10))
    kind = rng.randrange(4)
    if kind == 0:
        return f"[{a},{b}]", f"x \\in [{c},{d}]", same
    if kind == 1:
        return f"[{a},{b}]", f"{c} \\le x \\le {d}", same
    if kind == 2:
        return f"(-\\infty,{a})\\cup({b},\\infty)", f"(-\\infty,{c})\\cup({d},\\infty)", same
    p, q = sp.Rational(rng.randint(1, 9), 5), sp.Rational(rng.randint(11, 29), 3)
    q2 = q if same else q + 1
    return f"({float(p):.4g}, {float(q2):.5g}]", f"({frac_tex(p)}, {frac_tex(q)}]", same


def unordered(rng):
    xs = sorted({num(rng) for _ in range(rng.randint(2, 3))})
    if len(xs) < 2:
        xs = [1, 2]
    same = rng.random() < 0.5
    ys = list(xs) if same else xs[:-1] + [other(rng, xs[-1])]
    rng.shuffle(ys)
    kind = rng.randrange(3)
    if kind == 0:
        gold = ", ".join(f"({x},{x + 1})" for x in xs)
        pred = ", ".join(f"({y},{y + 1})" for y in ys)
        return gold, pred, same
    if kind == 1:
        return ", ".join(map(str, xs)), " \\text{ or } ".join(f"x={y}" for y in ys), same
    return ", ".join(map(str, xs)), " \\text{ and } ".join(map(str, ys)), same


def matrices(rng):
    n = rng.randint(2, 3)
    vals = [sp.Rational(rng.randint(-99, 99), rng.choice([1, 4, 8])) for _ in range(n)]
    same = rng.random() < 0.5
    pvals = list(vals) if same else vals[:-1] + [vals[-1] + 1]
    env = rng.choice(["pmatrix", "bmatrix"])
    penv = rng.choice(["pmatrix", "bmatrix"])
    gold = f"\\begin{{{env}}}" + " \\\\ ".join(frac_tex(v) for v in vals) + f"\\end{{{env}}}"
    pred = f"\\begin{{{penv}}}" + " \\\\ ".join(f"{float(v):g}" for v in pvals) + f"\\end{{{penv}}}"
    return gold, pred, same


def freeform(rng):
    a = num(rng, 1, 99)
    same = rng.random() < 0.5
    b = a if same else other(rng, a, 1, 99)
    kind = rng.randrange(3)
    steps = f"First we add the parts: ${a - 1} + 1 = {a}$ is not yet the end. Then we check the units."
    if kind == 0:
        return str(a), f"{steps} So the answer is $\\boxed{{{b}}}$.", same
    if kind == 1:
        return f"{a}\\text{{ cm}}", f"{steps} The length is $\\boxed{{{b} \\text{{ cm}}}}$.", same
    return f"{a}, {a + 1}", f"{steps} The roots are $\\boxed{{{b}}}$ and $\\boxed{{{a + 1}}}$.", same


def decimal_commas(rng):
    kind = rng.randrange(3)
    same = rng.random() < 0.5
    if kind == 0:
        d = rng.randint(100, 999)
        e = d if same else other(rng, d, 100, 999)
        return f"0.{d}", f"0,{e}", same
    if kind == 1:
        i, d = rng.randint(1, 9), rng.randint(10, 99)
        e = d if same else other(rng, d, 10, 99)
        return f"{i}.{d}", f"{i},{e}", same
    k = rng.randint(1, 9)
    m = k if same else other(rng, k, 1, 9)
    return f"{k}000", f"{m},000", same


def malformed(rng):
    a, b = num(rng, 1, 9), num(rng, 1, 9)
    kind = rng.randrange(2)
    if kind == 0:
        return f"{a}x+{b}", f"The answer is ${a}x\n+{b}$.", False
    return f"{a}x+{b}", f"{a}y+{b}", False


FAMILIES = {"labels": labels, "intervals": intervals, "unordered": unordered, "matrices": matrices,
            "freeform": freeform, "decimal_commas": decimal_commas, "malformed": malformed}


def wrap(s):
    return s if ("$" in s or "\\boxed" in s) else f"${s}$"


class Timeout(Exception):
    pass


def mv(gold, pred):
    def alarm(*_):
        raise Timeout()
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(5)
    try:
        return bool(verify(parse(wrap(gold)), parse(wrap(pred))))
    except Timeout:
        return False
    finally:
        signal.alarm(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-family", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for fam, gen in FAMILIES.items():
            for _ in range(a.per_family):
                gold, pred, same = gen(rng)
                f.write(json.dumps({"family": fam, "gold": gold, "pred": pred,
                                    "math_verify": mv(gold, pred), "sympy": bool(same)}) + "\n")


if __name__ == "__main__":
    main()
