#!/usr/bin/env python3
"""Constructed (gold, prediction) cases for temper's math grader, one set per answer family
(labels, intervals, unordered lists, matrices, free-form solutions, decimal commas, malformed
math), each labelled by math-verify 0.9.0 only: `verify(parse(wrap(gold)), parse(wrap(pred)))`,
a bare answer put inside `$..$` (the test hands temper the same wrapped texts).

The pairs are built from values the generator knows (seeded); the sympy objects built alongside
only steer which pairs are written (half right, half perturbed). They label nothing: where temper
and math-verify differ, math-verify's verdict is the reference (tests/math_verify_agreement.rs).

Usage: .venv/bin/python tools/grader_cases.py OUT.jsonl [--per-family 2000] [--seed 0]
Each line: {"family", "kind", "gold", "pred", "math_verify": bool}.
"""
import argparse
import json
import random
import signal

import sympy as sp
from math_verify import parse, verify

R = sp.Rational
X = sp.Symbol("x")


def frac_tex(q):
    q = R(q)
    if q.q == 1:
        return str(q.p)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.p)}}}{{{q.q}}}"


def round_to(q, d):
    """q rounded half away from zero to d decimals, as a Rational."""
    s = 1 if q >= 0 else -1
    return s * sp.floor(abs(q) * 10**d + R(1, 2)) / 10**d


def dec_tex(q, d):
    """The decimal text of a Rational that has at most d decimals."""
    q = R(q)
    sign = "-" if q < 0 else ""
    n = abs(q) * 10**d
    assert n.q == 1, q
    i, f = divmod(int(n), 10**d)
    return f"{sign}{i}.{f:0{d}d}" if d else f"{sign}{i}"


def num(rng, lo=-20, hi=20):
    return rng.randint(lo, hi)


def other(rng, v, lo=-20, hi=20):
    w = v
    while w == v:
        w = rng.randint(lo, hi)
    return w


def pair(rng, lo=-20, hi=20):
    """(a, b, c, d, same): c, d equal a, b or differ in d."""
    a, b = num(rng, lo, hi), num(rng, lo, hi)
    same = rng.random() < 0.5
    return a, b, a, (b if same else other(rng, b, lo, hi))


def labels(rng):
    a, b, c, d = pair(rng, 1, 40)
    T = sp.Tuple
    kinds = [
        ("tuple_named", f"({a},{b})", f"(p,q)=({c},{d})", T(a, b), T(c, d)),
        ("segments", f"{a}, {b}", f"AB={c}, CD={d}", T(a, b), T(c, d)),
        ("ratio", f"{a}:{b}", f"V_1:V_2={c}:{d}", T(a, b), T(c, d)),
        ("function", f"{b}", f"f(x)={d}", R(b), R(d)),
        ("variable", f"{b}", f"x={d}", R(b), R(d)),
        ("two_variables", f"({a},{b})", f"a={c}, b={d}", T(a, b), T(c, d)),
        ("angle", f"{b}^\\circ", f"\\angle ABC = {d}^\\circ", R(b), R(d)),
    ]
    return rng.choice(kinds)


def intervals(rng):
    a, b = num(rng, -10, 0), num(rng, 1, 10)
    same = rng.random() < 0.5
    c, d = (a, b) if same else ((a, other(rng, b, 1, 10)) if rng.random() < 0.5 else (other(rng, a, -10, 0), b))
    I, oo = sp.Interval, sp.oo
    kind = rng.randrange(8)
    if kind == 0:
        return "membership", f"[{a},{b}]", f"x \\in [{c},{d}]", I(a, b), I(c, d)
    if kind == 1:
        return "double_inequality", f"[{a},{b}]", f"{c} \\le x \\le {d}", I(a, b), I(c, d)
    if kind == 2:
        return ("half_open_inequality", f"[{a},{b})", f"{c} \\le x < {d}",
                I.Ropen(a, b), I.Ropen(c, d))
    if kind == 3:
        return "function_range", f"({a},{b})", f"{c}<f(x)<{d}", I.open(a, b), I.open(c, d)
    if kind == 4:
        return "ray", f"({b},\\infty)", f"x>{d}", I.open(b, oo), I.open(d, oo)
    if kind == 5:
        g = f"(-\\infty,{a})\\cup({b},\\infty)"
        p = f"({d},\\infty)\\cup(-\\infty,{c})" if rng.random() < 0.5 else f"(-\\infty,{c})\\cup({d},\\infty)"
        return "union", g, p, I.open(-oo, a) | I.open(b, oo), I.open(-oo, c) | I.open(d, oo)
    if kind == 6:
        return ("union_or", f"(-\\infty,{a}]\\cup[{b},\\infty)", f"x \\le {c} \\text{{ or }} x \\ge {d}",
                I(-oo, a) | I(b, oo), I(-oo, c) | I(d, oo))
    # Decimal endpoints rounded to 4 digits against the exact fractions.
    p, q = R(rng.randint(1, 9), 5), R(rng.randint(11, 29), 3)
    q2 = q if same else q + R(1, 3)
    return ("decimal_endpoints", f"({dec_tex(p, 1)}, {dec_tex(round_to(q, 4), 4)}]",
            f"({frac_tex(p)}, {frac_tex(q2)}]",
            I.Lopen(p, round_to(q, 4)), I.Lopen(p, round_to(q2, 4)))


def unordered(rng):
    xs = sorted(set(num(rng) for _ in range(rng.randint(2, 4))))
    if len(xs) < 2:
        xs = [xs[0], xs[0] + 1]
    same = rng.random() < 0.5
    ys = list(xs) if same else xs[:-1] + [other(rng, xs[-1])]
    rng.shuffle(ys)
    S, T = sp.FiniteSet, sp.Tuple
    kind = rng.randrange(6)
    if kind == 0:
        return ("tuples", ", ".join(f"({x},{x + 1})" for x in xs), ", ".join(f"({y},{y + 1})" for y in ys),
                S(*[T(x, x + 1) for x in xs]), S(*[T(y, y + 1) for y in ys]))
    if kind == 1:
        word = rng.choice(["or", "and"])
        return (f"tuples_{word}", ", ".join(f"({x},{x + 1})" for x in xs),
                f" \\text{{ {word} }} ".join(f"({y},{y + 1})" for y in ys),
                S(*[T(x, x + 1) for x in xs]), S(*[T(y, y + 1) for y in ys]))
    if kind == 2:
        return ("or_equations", ", ".join(map(str, xs)), " \\text{ or } ".join(f"x={y}" for y in ys),
                S(*xs), S(*ys))
    if kind == 3:
        return "and_list", ", ".join(map(str, xs)), " \\text{ and } ".join(map(str, ys)), S(*xs), S(*ys)
    if kind == 4:
        return ("set_braces", "\\{" + ", ".join(map(str, xs)) + "\\}", "\\{" + ", ".join(map(str, ys)) + "\\}",
                S(*xs), S(*ys))
    # Tuples are ordered: the same entries in another order are another answer.
    a, b = xs[0], xs[1]
    if same:
        return "tuple_order", f"({a},{b})", f"({a},{b})", T(a, b), T(a, b)
    return "tuple_order", f"({a},{b})", f"({b},{a})", T(a, b), T(b, a)


def matrix_tex(env, rows):
    return f"\\begin{{{env}}}" + " \\\\ ".join(" & ".join(r) for r in rows) + f"\\end{{{env}}}"


def matrices(rng):
    env, penv = rng.choice(["pmatrix", "bmatrix"]), rng.choice(["pmatrix", "bmatrix"])
    same = rng.random() < 0.5
    kind = rng.randrange(3)
    if kind == 0:
        n = rng.randint(2, 3)
        vals = [R(rng.randint(-99, 99), rng.choice([1, 4, 8])) for _ in range(n)]
        pv = list(vals) if same else vals[:-1] + [vals[-1] + 1]
        g = matrix_tex(env, [[frac_tex(v)] for v in vals])
        p = matrix_tex(penv, [[dec_tex(v, 3)] for v in pv])
        return "vector_decimals", g, p, sp.Matrix(vals), sp.Matrix(pv)
    if kind == 1:
        vals = [R(rng.randint(-9, 9)) for _ in range(4)]
        pv = list(vals) if same else vals[:3] + [vals[3] + rng.choice([-1, 1])]
        g = matrix_tex(env, [[frac_tex(v) for v in vals[:2]], [frac_tex(v) for v in vals[2:]]])
        p = matrix_tex(penv, [[frac_tex(v) for v in pv[:2]], [frac_tex(v) for v in pv[2:]]])
        return "square", g, p, sp.Matrix(2, 2, vals), sp.Matrix(2, 2, pv)
    # The gold rounded to d decimals; the prediction exact (thirds, sevenths: never terminating).
    d = rng.randint(2, 4)
    n = rng.randint(2, 3)
    exact = [R(rng.randint(-99, 99), rng.choice([3, 7, 9])) for _ in range(n)]
    exact = [v if v.q != 1 else v + R(1, 3) for v in exact]
    pv = list(exact) if same else exact[:-1] + [exact[-1] + R(1, 3)]
    g = matrix_tex(env, [[dec_tex(round_to(v, d), d)] for v in exact])
    p = matrix_tex(penv, [[frac_tex(v)] for v in pv])
    return ("rounded_gold", g, p, sp.Matrix([round_to(v, d) for v in exact]),
            sp.Matrix([round_to(v, d) for v in pv]))


def freeform(rng):
    a = num(rng, 2, 99)
    same = rng.random() < 0.5
    b = a if same else other(rng, a, 2, 99)
    steps = f"First we add the parts: ${a - 1} + 1 = {a}$ is not yet the end. Then we check the units."
    kind = rng.randrange(6)
    if kind == 0:
        return "boxed", str(a), f"{steps} So the answer is $\\boxed{{{b}}}$.", R(a), R(b)
    if kind == 1:
        return ("boxed_units", f"{a}\\text{{ cm}}", f"{steps} The length is $\\boxed{{{b} \\text{{ cm}}}}$.",
                R(a), R(b))
    if kind == 2:
        return ("several_boxed", f"{a}, {a + 1}",
                f"{steps} The roots are $\\boxed{{{b}}}$ and $\\boxed{{{a + 1}}}$.",
                sp.FiniteSet(a, a + 1), sp.FiniteSet(b, a + 1))
    if kind == 3:
        return ("last_sentence", str(a), f"{steps} Hence the final value is $\\frac{{{2 * b}}}{{2}}$.",
                R(a), R(b))
    if kind == 4:
        return ("last_sentence_equation", str(a), f"{steps} Therefore $y = {b}$.", R(a), R(b))
    return ("corrected_box", str(a),
            f"{steps} At first I found $\\boxed{{{a + 100}}}$, but that was wrong; the answer is $\\boxed{{{b}}}$.",
            R(a), R(b))


def comma_number(text):
    """What a number written with commas means under docs/rewards.md: groups of exactly three
    digits after a non-zero lead are thousands, anything else after one comma is a decimal comma."""
    parts = text.split(",")
    if len(parts) > 1 and parts[0] not in ("0", "-0") and all(len(p) == 3 for p in parts[1:]):
        return R("".join(parts))
    assert len(parts) == 2
    return R(f"{parts[0]}.{parts[1]}")


def decimal_commas(rng):
    same = rng.random() < 0.5
    kind = rng.randrange(6)
    if kind == 0:
        d = rng.randint(100, 999)
        e = d if same else other(rng, d, 100, 999)
        g, p = f"0.{d}", f"0,{e}"
    elif kind == 1:
        i, d = rng.randint(1, 9), rng.randint(10, 99)
        e = d if same else other(rng, d, 10, 99)
        g, p = f"{i}.{d}", f"{i},{e}"
    elif kind == 2:
        k = rng.randint(1, 99)
        m = k if same else other(rng, k, 1, 99)
        g, p = f"{k}000", f"{m},000"
    elif kind == 3:
        v = rng.randint(1000, 99999)
        w = v if same else other(rng, v, 1000, 99999)
        g, p = f"{v}.5", f"{w:,}.5"
    elif kind == 4:
        v = rng.randint(1_000_000, 9_999_999)
        w = v if same else other(rng, v, 1_000_000, 9_999_999)
        g, p = str(v), f"{w:,}"
    else:
        # `1,234` is a thousand-grouped integer, never 1.234.
        v = rng.randint(1001, 9999)
        g = str(v) if same else f"{v // 1000}.{v % 1000:03d}"
        p = f"{v:,}"
    kinds = ["leading_zero", "two_digit_decimal", "thousands", "thousands_and_point", "millions",
             "thousands_not_decimal"]
    pv = comma_number(p) if "." not in p else R(p.replace(",", ""))
    return kinds[kind], g, p, R(g), pv


def malformed(rng):
    a, b = num(rng, 2, 99), num(rng, 1, 99)
    gold = a * X + b
    kind = rng.randrange(4)
    if kind == 0:
        return "split_lines", f"{a}x+{b}", f"The answer is ${a}x\n+{b}$.", gold, None
    if kind == 1:
        return "renamed_variable", f"{a}x+{b}", f"{a}y+{b}", gold, a * sp.Symbol("y") + b
    if kind == 2:
        return "unbalanced_braces", f"\\frac{{{a}}}{{{b}}}", f"\\frac{{{a}}}{{{b}", R(a, b), None
    return "unclosed_box", f"{a}", f"So the answer is \\boxed{{{a}", R(a), None


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
    ap.add_argument("--per-family", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for fam, gen in FAMILIES.items():
            seen = set()
            while len(seen) < a.per_family:
                kind, gold, pred, gv, pv = gen(rng)
                if (gold, pred) in seen:
                    continue
                seen.add((gold, pred))
                f.write(json.dumps({"family": fam, "kind": kind, "gold": gold, "pred": pred,
                                    "math_verify": mv(gold, pred)}) + "\n")


if __name__ == "__main__":
    main()
