#!/usr/bin/env python3
"""Realistic (gold, response) pairs for temper's math grader, each labelled by math-verify only.

The golds are written the way datasets give them (MATH / NuminaMath answer fields inside `$..$`,
or a short solution ending in `\\boxed{}`), the responses the way models write them: chain-of-
thought paragraphs with several numbers and formulas before the answer, answers in boxes, after
"the answer is", in the last math environment or as the last number; labelled answers inside math
delimiters; relations against intervals; sets and lists; matrices; answers that are not answers.
About half of the responses are right and half are perturbed, but nothing here decides which:
the label of every pair is math-verify 0.9.0's verdict.

The call mirrored is math-verify's documented default, `verify(parse(gold), parse(pred))`, with
`parse`'s default extraction targets `[LatexExtractionConfig(), ExprExtractionConfig()]` and its
default time limits (5 s per parse and per comparison, by SIGALRM, as math-verify itself does).
Where a case sets `options`, `extraction_config` goes to both parses and the rest (`strict`,
`allow_set_relation_comp`, `float_rounding`) to `verify`, under those names; the test hands the
same options to temper. A gold without math markup (only the multiple-choice letters) is boxed
first, as verl does with a dataset's answer field, except for the string target.

Usage: .venv/bin/python tools/grader_corpus.py OUT.jsonl [--per-family 700] [--seed 1]
Each line: {"family", "kind", "gold", "pred", "options"?, "math_verify": bool}.
"""
import argparse
import json
import random

from math_verify import (
    ExprExtractionConfig,
    LatexExtractionConfig,
    StringExtractionConfig,
    parse,
    verify,
)

# ---------------------------------------------------------------- prose around an answer

OPENERS = [
    "Let's solve this step by step.",
    "We need to find the requested quantity.",
    "To solve the problem, we first write down what is given.",
    "Let me think about this carefully.",
    "First, let's understand the problem.",
    "We start by setting up the equations.",
]

MIDDLES = [
    "There are {a} groups with {b} items each, so there are $ {a} \\times {b} = {ab} $ items.",
    "Adding the two amounts gives {a} + {b} = {apb}.",
    "Since $x + {a} = {apb}$, we get $x = {b}$.",
    "The total cost is {a} \\cdot {b} = {ab} dollars before the discount.",
    "Dividing by {b}, each part is $\\frac{{{ab}}}{{{b}}} = {a}$.",
    "We check: $ {apb} - {b} = {a} $, which is consistent.",
    "Now the remaining {b} students are split into groups.",
    "Substituting $y = {a}$ into the first equation gives $2y + {b} = {c}$.",
    "The area of the rectangle is ${a} \\cdot {b} = {ab}$ square units.",
    "Note that {a}% of the {b} cases were excluded in step 2.",
]


def cot(rng, lines=None):
    """A few sentences of reasoning with their own numbers and formulas."""
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    vals = {"a": a, "b": b, "ab": a * b, "apb": a + b, "c": 2 * a + b}
    out = [rng.choice(OPENERS)]
    for m in rng.sample(MIDDLES, lines or rng.randint(2, 4)):
        out.append(m.format(**vals))
    return " ".join(out) if rng.random() < 0.5 else "\n\n".join(out)


def ending(rng, ans, math=True):
    """The sentence that gives the answer, in the ways models end a solution."""
    m = f"${ans}$" if math else ans
    forms = [
        f"Therefore, the final answer is $\\boxed{{{ans}}}$.",
        f"The answer is $\\boxed{{{ans}}}$.",
        f"**Final Answer**\n\\[\n\\boxed{{{ans}}}\n\\]",
        f"So the answer is {m}.",
        f"Final Answer: The final answer is {m}. I hope it is correct.",
        f"Thus we obtain {m}.",
        f"Hence the result is \\({ans}\\).",
        f"Putting everything together,\n$$\n{ans}\n$$",
        f"The answer: {m}",
    ]
    return rng.choice(forms)


def other_int(rng, v, lo, hi):
    w = v
    while w == v:
        w = rng.randint(lo, hi)
    return w


def maybe(rng, good, bad):
    return good if rng.random() < 0.5 else bad


def dollars(gold):
    return f"${gold}$"


# ---------------------------------------------------------------- families


def prose(rng):
    """Answers found in long outputs: ranking of boxes, answer phrases, math, numbers."""
    n = rng.randint(2, 2000)
    p = maybe(rng, n, other_int(rng, n, 2, 2000))
    k = rng.randrange(12)
    if k == 0:
        return "boxed_end", dollars(n), f"{cot(rng)} {ending(rng, p)}"
    if k == 1:
        return "answer_is_plain", dollars(n), f"{cot(rng)} So the answer is {p}."
    if k == 2:
        return "last_math", dollars(n), f"{cot(rng)} Altogether that is ${p}$ marbles."
    if k == 3:
        return "last_number", dollars(n), f"{cot(rng)} In total she has {p} stickers left"
    if k == 4:
        return ("boxed_then_words", dollars(n),
                f"{cot(rng)} The answer is $\\boxed{{{p}}}$, since {n + 3} would exceed the limit.")
    if k == 5:
        v = rng.randint(1000, 999999)
        w = maybe(rng, v, other_int(rng, v, 1000, 999999))
        s = f"{w:,}".replace(",", rng.choice(["{,}", "\\,", "\\!,\\!"]))
        return "thousands_latex", dollars(v), f"{cot(rng)} {ending(rng, s)}"
    if k == 6:
        e, c = rng.randint(1, 99), rng.randint(1, 99)
        c2 = maybe(rng, c, other_int(rng, c, 1, 99))
        cur = rng.choice(["€", "\\euro", "EUR", "$"])
        gold = f"{e}.{c:02d}"
        tail = rng.choice([f"{e},{c2:02d} {cur}", f"{e},{c2:02d}{cur}"]) if cur != "$" else f"{e},{c2:02d} \\$"
        return "decimal_comma_currency", dollars(gold), f"{cot(rng)} Sie bezahlt insgesamt {tail}."
    if k == 7:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        b2 = maybe(rng, b, other_int(rng, b, 1, 30))
        sep = rng.choice([", ", " and ", " \\quad "])
        return ("several_boxes", dollars(f"{a}, {b}"),
                f"{cot(rng)} The two solutions are $\\boxed{{{a}}}${sep}$\\boxed{{{b2}}}$.")
    if k == 8:
        a, b = rng.randint(1, 30), rng.randint(31, 60)
        b2 = maybe(rng, b, other_int(rng, b, 31, 60))
        return ("parts", dollars(f"{a}, {b}"),
                f"**Part (a).** {cot(rng, 2)} So part (a) is $\\boxed{{{a}}}$.\n\n"
                f"**Part (b).** {cot(rng, 2)} So part (b) is $\\boxed{{{b2}}}$.")
    if k == 9:
        q = maybe(rng, n, n + 1)
        return ("answer_phrase_then_math", dollars(n),
                f"{cot(rng)} The answer is {q}.\n\nCheck: ${q} - 1 = {q - 1}$ is consistent.")
    if k == 10:
        f = rng.randint(1, 9)
        g = f"\\frac{{{f}}}{{{f + rng.randint(1, 9)}}}"
        pr = maybe(rng, g, f"\\frac{{{f + 1}}}{{{f + 11}}}")
        return "fraction_words", dollars(g), f"{cot(rng)} The probability is {pr}."
    pct = rng.randint(1, 99)
    pp = maybe(rng, pct, other_int(rng, pct, 1, 99))
    return ("percent", dollars(rng.choice([f"{pct}\\%", str(pct)])),
            f"{cot(rng)} So {pp}% of the students passed.")


def labelled(rng):
    """`name = value` inside math delimiters, on either side."""
    a, b = rng.randint(1, 40), rng.randint(1, 40)
    a2 = maybe(rng, a, other_int(rng, a, 1, 40))
    env = rng.choice([("$", "$"), ("\\(", "\\)"), ("$$", "$$"), ("\\[", "\\]")])

    def m(s):
        return f"{env[0]}{s}{env[1]}"

    kinds = [
        ("variable", f"{a}", f"x = {a2}"),
        ("function", f"{a}", f"f(3) = {a2}"),
        ("pair_named", f"({a},{b})", f"(a,b) = ({a2},{b})"),
        ("ratio", f"{a}:{b}", f"AB:BC = {a2}:{b}"),
        ("abs_segment", f"{a}", f"|AB| = {a2}"),
        ("gold_labelled", f"x = {a}", f"{a2}"),
        ("both_labelled", f"x = {a}", f"x = {a2}"),
        ("other_name", f"x = {a}", f"y = {a2}"),
        ("two_values", f"x = {a}, y = {b}", f"x = {a2}, y = {b}"),
        ("angle", f"{a}^\\circ", f"\\angle ABC = {a2}^\\circ"),
        ("chain", f"{a}", f"x = \\frac{{{2 * a2}}}{{2}} = {a2}"),
    ]
    kind, g, p = rng.choice(kinds)
    where = rng.randrange(3)
    if where == 0:
        pred = m(p)
    elif where == 1:
        pred = f"{cot(rng)} Therefore {m(p)}."
    else:
        pred = f"{cot(rng)} The answer is {m(p)}."
    return kind, dollars(g), pred


def relations(rng):
    """Chain inequalities, intervals and |z| inequalities, both directions."""
    a, b = rng.randint(-10, 0), rng.randint(1, 10)
    b2 = maybe(rng, b, other_int(rng, b, 1, 10))
    r = rng.randint(1, 9)
    r2 = maybe(rng, r, other_int(rng, r, 1, 9))
    le, lt = rng.choice(["\\le", "\\leq"]), "<"
    kinds = [
        ("chain_vs_interval", f"[{a},{b}]", f"{a} {le} x {le} {b2}"),
        ("interval_vs_chain", f"{a} {le} x {le} {b}", f"[{a},{b2}]"),
        ("membership", f"[{a},{b}]", f"x \\in [{a},{b2}]"),
        ("half_open", f"[{a},{b})", f"{a} {le} x {lt} {b2}"),
        ("ray", f"({b},\\infty)", f"x > {b2}"),
        ("ray_reverse", f"x > {b}", f"({b2}, \\infty)"),
        ("abs_lt", f"(-{r},{r})", f"|x| < {r2}"),
        ("abs_gt", f"(-\\infty,-{r})\\cup({r},\\infty)", f"|z| > {r2}"),
        ("abs_gt_reverse", f"|z| > {r}", f"(-\\infty,-{r2})\\cup({r2},\\infty)"),
        ("abs_le_reverse", f"|x| \\le {r}", f"[-{r2},{r2}]"),
        ("same_relation", f"{a} < x < {b}", f"{a} < x < {b2}"),
        ("flipped", f"x < {b}", f"{b2} > x"),
    ]
    kind, g, p = rng.choice(kinds)
    options = {}
    if rng.random() < 0.5:
        options["allow_set_relation_comp"] = True
    pred = p if rng.random() < 0.3 else f"{cot(rng)} {ending(rng, p)}"
    return kind, dollars(g), pred, options


def sets(rng):
    """Tuples in any order, repeats, alternatives joined by words, sets with text."""
    xs = sorted(rng.sample(range(-12, 13), rng.randint(2, 3)))
    ys = list(xs) if rng.random() < 0.5 else xs[:-1] + [xs[-1] + rng.choice([-20, 20])]
    rng.shuffle(ys)
    js = lambda v: ", ".join(map(str, v))  # noqa: E731
    kinds = [
        ("set_any_order", f"\\{{{js(xs)}\\}}", f"\\{{{js(ys)}\\}}"),
        ("list_any_order", js(xs), js(ys)),
        ("tuple_order", f"({js(xs)})", f"({js(ys)})"),
        ("repeated", js(xs), js(ys + [ys[0]])),
        ("or_words", js(xs), " \\text{ or } ".join(map(str, ys))),
        ("or_equations", js(xs), " \\text{ or } ".join(f"x = {y}" for y in ys)),
        ("semicolons", js(xs), "; ".join(map(str, ys))),
        ("and_words", js(xs), " \\text{ and } ".join(map(str, ys))),
        ("set_with_text", f"\\{{{js(xs)}\\}}", f"\\text{{the set }} \\{{{js(ys)}\\}}"),
        ("list_with_units", ", ".join(f"{x}\\text{{ cm}}" for x in xs), js(ys)),
        ("pairs_any_order", ", ".join(f"({x},{x * x})" for x in xs), ", ".join(f"({y},{y * y})" for y in ys)),
        ("plain_or_text", js(xs), " or ".join(map(str, ys))),
    ]
    kind, g, p = rng.choice(kinds)
    pred = p if rng.random() < 0.3 else f"{cot(rng)} {ending(rng, p)}"
    return kind, dollars(g), pred


def mat(env, rows):
    return f"\\begin{{{env}}}" + " \\\\ ".join(" & ".join(map(str, r)) for r in rows) + f"\\end{{{env}}}"


def matrices(rng):
    """Literal matrices, their sums and products, precision, parentheses."""
    env = rng.choice(["pmatrix", "bmatrix"])
    A = [[rng.randint(-5, 5) for _ in range(2)] for _ in range(2)]
    B = [[rng.randint(-5, 5) for _ in range(2)] for _ in range(2)]
    S = [[A[i][j] + B[i][j] for j in range(2)] for i in range(2)]
    P = [[sum(A[i][k] * B[k][j] for k in range(2)) for j in range(2)] for i in range(2)]
    bad = lambda M: [M[0], [M[1][0], M[1][1] + 1]]  # noqa: E731
    wrong = rng.random() < 0.5
    k = rng.randrange(7)
    if k == 0:
        g, p = mat(env, S), f"{mat(env, A)} + {mat(env, B)}"
        if wrong:
            g = mat(env, bad(S))
        return "sum", dollars(g), f"{cot(rng)} {ending(rng, p)}"
    if k == 1:
        g, p = mat(env, P), f"{mat(env, A)} {mat(env, B)}"
        if wrong:
            g = mat(env, bad(P))
        return "product", dollars(g), f"{cot(rng)} {ending(rng, p)}"
    if k == 2:
        num_, den = rng.randint(1, 20), rng.choice([3, 7, 9])
        d = rng.randint(2, 4)
        v = round(num_ / den + (0 if not wrong else 0.1), d)
        g = mat(env, [[f"\\frac{{{num_}}}{{{den}}}"], [A[0][0]]])
        p = mat(env, [[f"{v:.{d}f}"], [A[0][0]]])
        return "decimal_entries", dollars(g), f"{cot(rng)} {ending(rng, p)}"
    if k == 3:
        g = mat(env, A)
        inner = mat("matrix", A if not wrong else bad(A))
        paren = "\\left( " + inner + " \\right)"
        return "parenthesised", dollars(g), f"{cot(rng)} {ending(rng, paren)}"
    if k == 4:
        v = [rng.randint(-9, 9) for _ in range(3)]
        w = v if not wrong else v[:2] + [v[2] + 1]
        g = mat(env, [[x] for x in v])
        p = rng.choice([mat("pmatrix", [[x] for x in w]), f"\\left({js3(w)}\\right)", f"({js3(w)})"])
        return "column_vector", dollars(g), f"{cot(rng)} {ending(rng, p)}"
    if k == 5:
        num_, den = rng.randint(1, 20), rng.choice([3, 7])
        d = rng.randint(2, 4)
        v = round(num_ / den, d)
        g = mat(env, [[f"{v:.{d}f}"], [A[0][0]]])
        p = mat(env, [[f"\\frac{{{num_ + (1 if wrong else 0)}}}{{{den}}}"], [A[0][0]]])
        return "rounded_gold", dollars(g), f"{cot(rng)} {ending(rng, p)}"
    g = mat(env, A)
    return "square", dollars(g), f"{cot(rng)} {ending(rng, mat(rng.choice(['pmatrix', 'bmatrix']), bad(A) if wrong else A))}"


def js3(v):
    return ", ".join(map(str, v))


def strictness(rng):
    """A function of another variable name, with `strict` on (math-verify's default) and off."""
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    b2 = maybe(rng, b, other_int(rng, b, 1, 9))
    v1, v2 = rng.choice([("x", "y"), ("x", "t"), ("n", "k"), ("x", "x")])
    kinds = [
        ("polynomial", f"{a}{v1}^2 + {b}", f"{a}{v2}^2 + {b2}"),
        ("function_def", f"f({v1}) = {a}{v1} + {b}", f"f({v2}) = {a}{v2} + {b2}"),
        ("fraction", f"\\frac{{{a}}}{{{v1} + {b}}}", f"\\frac{{{a}}}{{{v2} + {b2}}}"),
        ("sqrt", f"\\sqrt{{{v1}^2 + {b}}}", f"\\sqrt{{{v2}^2 + {b2}}}"),
    ]
    kind, g, p = rng.choice(kinds)
    options = {"strict": rng.random() < 0.5}
    pred = p if rng.random() < 0.3 else f"{cot(rng)} {ending(rng, p)}"
    return kind, dollars(g), pred, options


def not_answer(rng):
    """Text that is not an extracted answer: inline math over lines, a `$` that never closes."""
    a, b = rng.randint(2, 99), rng.randint(1, 99)
    k = rng.randrange(5)
    if k == 0:
        return "inline_over_lines", dollars(f"{a}x+{b}"), f"{cot(rng)} The answer is ${a}x\n+{b}$."
    if k == 1:
        return "dollar_opens_number", dollars(a), f"{cot(rng)} So she pays ${a} for the ticket and ${b} for food"
    if k == 2:
        return "unclosed_dollar_end", dollars(a), f"{cot(rng)} The answer is ${a}"
    if k == 3:
        return ("inline_paren_over_lines", dollars(f"{a}x+{b}"),
                f"{cot(rng)} The answer is \\({a}x\n+ {b}\\).")
    return "unclosed_box", dollars(a), f"{cot(rng)} So the answer is \\boxed{{{a}"


def math_golds(rng):
    """MATH / NuminaMath-style gold answers (a solution ending in a box, or the answer field),
    against model outputs."""
    a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(2, 9)
    wrong = rng.random() < 0.5
    kinds = [
        ("fraction", f"\\frac{{{a}}}{{{a + c}}}", f"\\frac{{{2 * a}}}{{{2 * (a + c)}}}" if not wrong else f"\\frac{{{a + 1}}}{{{a + c}}}"),
        ("sqrt", f"{a}\\sqrt{{{c}}}", f"\\sqrt{{{a * a * c}}}" if not wrong else f"{a + 1}\\sqrt{{{c}}}"),
        ("pi", f"{a}\\pi", f"{a}\\pi" if not wrong else f"{a + 1}\\pi"),
        ("decimal", f"{a}.{b}", f"{a}.{b}" if not wrong else f"{a}.{b + 1}"),
        ("interval", f"[{-a}, {b})", f"[{-a},{b})" if not wrong else f"({-a},{b})"),
        ("union", f"(-\\infty,{-a}) \\cup ({b},\\infty)", f"(-\\infty,{-a})\\cup({b},\\infty)" if not wrong else f"(-\\infty,{-a}]\\cup({b},\\infty)"),
        ("set", f"\\{{{a}, {a + b}\\}}", f"\\{{{a + b}, {a}\\}}" if not wrong else f"\\{{{a}, {a + b + 1}\\}}"),
        ("labelled_gold", f"y = {a}x + {b}", f"y = {a}x + {b}" if not wrong else f"y = {a}x - {b}"),
        ("text", rng.choice(["\\text{Evelyn}", "\\text{(C)}", "\\text{odd}", "\\text{Sunday}"]), None),
        ("degrees", f"{a * 5}^\\circ", f"{a * 5}^\\circ" if not wrong else f"{a * 5 + 5}^\\circ"),
        ("matrix", mat("pmatrix", [[a, b], [c, 0]]), mat("pmatrix", [[a, b], [c, 0 if not wrong else 1]])),
        ("expression", f"{a}x^2 + {b}x", f"x({a}x + {b})" if not wrong else f"{a}x^2 - {b}x"),
        ("complex", f"{a} + {b}i", f"{a}+{b}i" if not wrong else f"{a}-{b}i"),
        ("base", f"{a}{b}_{{{c + 1}}}", None),
    ]
    kind, g, p = rng.choice(kinds)
    if kind == "text":
        word = g[len("\\text{"):-1]
        p = f"\\text{{{word}}}" if not wrong else "\\text{Monday}"
    if kind == "base":
        p = g if not wrong else f"{a}{b + 1}_{{{c + 1}}}"
    if rng.random() < 0.5:
        gold = dollars(g)
    else:
        gold = f"{cot(rng, 2)} Therefore the answer is $\\boxed{{{g}}}$."
    pred = f"{cot(rng)} {ending(rng, p)}"
    return kind, gold, pred


def variety(rng):
    """Further answer shapes, added after the grader was tuned on the families above and first
    measured on a fresh seed: bold and colon answer lines, answers followed by more numbers,
    money, scientific notation, rounded decimals, radicals, logs, angles, words."""
    a, b = rng.randint(2, 60), rng.randint(2, 9)
    q = maybe(rng, a, other_int(rng, a, 2, 60))
    r = maybe(rng, b, b + 1)
    kinds = [
        ("bold_answer", dollars(a), f"{cot(rng)}\n\n**Answer:** {q}"),
        ("final_answer_colon", dollars(a), f"{cot(rng)}\nFinal answer: {q}"),
        ("answer_then_check", dollars(a), f"{cot(rng)} The answer is {q}. Note that {b} + {b} = {2 * b}."),
        ("boxed_then_units", dollars(a), f"{cot(rng)} So the total is $\\boxed{{{q}}}$ dollars."),
        ("money", dollars(f"{a}.50"), f"{cot(rng)} She spent ${q},000.50 in total." if rng.random() < 0.3 else f"{cot(rng)} She spent ${q}.50 in total."),
        ("plain_fraction", dollars(f"\\frac{{{b}}}{{{b + 5}}}"), f"{cot(rng)} The probability is {r}/{b + 5}."),
        ("negative", dollars(-a), f"{cot(rng)} Therefore the minimum value is $-{q}$."),
        ("scientific", dollars(f"{b}.5 \\times 10^{{3}}"), f"{cot(rng)} The answer is ${r}.5 \\times 10^3$."),
        ("rounded_decimal", dollars(f"\\frac{{1}}{{{b}}}"), f"{cot(rng)} The answer is approximately {round(1 / r, rng.choice([2, 4, 6])):.{rng.choice([2, 4, 6])}f}."),
        ("cube_root", dollars(f"\\sqrt[3]{{{b}}}"), f"{cot(rng)} $\\boxed{{{r}^{{1/3}}}}$"),
        ("log", dollars(f"\\log_2 {2 ** b}"), f"{cot(rng)} The answer is $\\boxed{{{r}}}$."),
        ("angle_plain", dollars(f"{a}^\\circ"), f"{cot(rng)} The angle measures $\\boxed{{{q}}}$ degrees."),
        ("word", dollars("\\text{Tuesday}"), f"{cot(rng)} The answer is $\\boxed{{\\text{{{rng.choice(['Tuesday', 'tuesday', 'Monday'])}}}}}$."),
        ("pi_fraction", dollars(f"\\frac{{\\pi}}{{{b}}}"), f"{cot(rng)} The answer is $\\boxed{{\\frac{{{maybe(rng, 1, 2)}\\pi}}{{{b}}}}}$."),
        ("pi_decimal", dollars(f"\\frac{{\\pi}}{{4}}"), f"{cot(rng)} So the answer is {maybe(rng, '0.785398', '0.785')}."),
        ("assignment_plain", dollars(a), f"{cot(rng)} Therefore, x = {q}."),
        ("two_labelled_envs", dollars(f"({a}, {b})"), f"{cot(rng)} We get $a = {q}$ and $b = {b}$."),
        ("set_words", dollars(f"\\{{{a}, {a + b}\\}}"), f"{cot(rng)} The solutions are $x = {q}$ and $x = {a + b}$."),
        ("interval_text", dollars(f"[{-b}, {a}]"), f"{cot(rng)} The range is $[{-r}, {a}]$."),
        ("expression_answer", dollars(f"{b}x^2 - {a}"), f"{cot(rng)} The answer is $\\boxed{{{r}x^2 - {a}}}$."),
        ("degree_gold_plain", dollars(f"{a}"), f"{cot(rng)} The angle is $\\boxed{{{q}^\\circ}}$."),
        ("percent_decimal", dollars(f"{a}\\%"), f"{cot(rng)} The answer is $\\boxed{{{maybe(rng, a / 100, a)}}}$."),
        ("boxed_in_text_later_math", dollars(a), f"{cot(rng)} The answer is $\\boxed{{{q}}}$. Indeed $\\frac{{{2 * q}}}{{2}} = {q}$ checks out."),
        ("answer_is_then_box", dollars(a), f"{cot(rng)} I think the answer is {a + 1}. Actually, correcting the slip: $\\boxed{{{q}}}$."),
        ("thousands_space", dollars(a * 1000 + 7), f"{cot(rng)} The population is {q} 007 people."),
    ]
    kind, gold, pred = rng.choice(kinds)
    if kind in ("rounded_decimal", "pi_decimal", "percent_decimal") and rng.random() < 0.5:
        # math-verify's float_rounding, set per reward.
        return kind, gold, pred, {"float_rounding": rng.choice([2, 3, 4])}
    return kind, gold, pred


def multiple_choice(rng):
    """Multiple-choice answers read with math-verify's string target (`extraction_config =
    ["string"]`), or with LaTeX only, or the default targets."""
    letters = "ABCD"
    g = rng.choice(letters)
    p = maybe(rng, g, rng.choice(letters.replace(g, "")))
    other = rng.choice(letters.replace(p, ""))
    opts = rng.choice([["string"], ["string"], ["latex"], ["latex", "expr"]])
    listing = " ".join(f"({c}) {rng.randint(1, 99)}" for c in letters)
    kinds = [
        ("answer_is", f"The answer is {p}."),
        ("bold", f"**Answer:** {p}"),
        ("alone", f"{p}"),
        ("then_other", f"The answer is {p}. {other} is wrong because the sum is odd."),
        ("boxed", f"$\\boxed{{{p}}}$"),
        ("paren", f"The answer is ({p})."),
        ("start_of_line", f"{p}. Because the other options fail."),
    ]
    kind, tail = rng.choice(kinds)
    pred = f"Options: {listing}. {cot(rng, 2)} {tail}"
    return kind, g, pred, {"extraction_config": opts}


FAMILIES = {
    "prose": prose,
    "labelled": labelled,
    "relations": relations,
    "sets": sets,
    "matrices_realistic": matrices,
    "strictness": strictness,
    "not_answer": not_answer,
    "math_golds": math_golds,
    "variety": variety,
    "multiple_choice": multiple_choice,
}


TARGETS = {"latex": LatexExtractionConfig, "expr": ExprExtractionConfig, "string": StringExtractionConfig}


def mv(gold, pred, options):
    """math-verify's verdict; `extraction_config` goes to both parses (as verl parses gold and
    response alike), the other options to `verify`."""
    opts = dict(options)
    kw = {}
    targets = opts.pop("extraction_config", ["latex", "expr"])
    if "extraction_config" in options:
        kw["extraction_config"] = [TARGETS[t]() for t in targets]
    # A dataset's answer field without math markup (`C`) is handed over as verl hands it,
    # inside `\\boxed{}`; the string target reads a bare letter as it is.
    if not any(m in gold for m in ["$", "\\(", "\\[", "\\boxed"]) and "string" not in targets:
        gold = f"\\boxed{{{gold}}}"
    try:
        return bool(verify(parse(gold, **kw), parse(pred, **kw), **opts))
    except Exception:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--per-family", type=int, default=700)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for fam, gen in FAMILIES.items():
            seen = set()
            while len(seen) < a.per_family:
                kind, gold, pred, *rest = gen(rng)
                options = rest[0] if rest else {}
                key = (gold, pred, json.dumps(options, sort_keys=True))
                if key in seen:
                    continue
                seen.add(key)
                line = {"family": fam, "kind": kind, "gold": gold, "pred": pred}
                if options:
                    line["options"] = options
                line["math_verify"] = mv(gold, pred, options)
                f.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
