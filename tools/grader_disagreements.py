#!/usr/bin/env python3
"""The reviewed list of pairs where temper's grader and math-verify disagree.

Reads the cases of tools/grader_cases.py and temper's verdicts on them (`temper grade --jsonl`),
and writes every pair where temper differs from math-verify, with the reviewed reason for its kind
(REASONS below). A disagreement of a kind (and direction) nobody has reviewed stops the tool: add
its reason here after reading the pairs, or fix the grader. `tests/math_verify_agreement.rs` checks
that the fixture lists exactly the current disagreements.

Usage:
  ./temper grade --jsonl crates/temper-reward/tests/fixtures/grader_cases.jsonl --out /tmp/temper.jsonl
  .venv/bin/python tools/grader_disagreements.py crates/temper-reward/tests/fixtures/grader_cases.jsonl \\
      /tmp/temper.jsonl crates/temper-reward/tests/fixtures/grader_disagreements.jsonl
"""
import json
import sys

MV_INEQUALITY = ("math-verify is wrong: it does not read an inequality in one variable as the set of "
                 "its solutions, so `-2 \\le x \\le 7`, `0<f(x)<1`, `x>3` and `x \\le 1 \\text{ or } x \\ge 2` "
                 "never equal the intervals they describe (docs/rewards.md, Equivalence rule 5)")
MV_ROUNDING = ("math-verify compares numbers at 6 decimals only; the gold is a decimal rounded to fewer "
               "places and the exact prediction rounds to it at the gold's precision (rule 3); "
               "math-verify is wrong for a rounded gold")
MV_COMMA = ("math-verify reads `2,74` as the list (2, 74); against a gold that is one number, a comma "
            "before other than three digits is a decimal comma (rule 9); math-verify is wrong")
MV_REPEATED = ("math-verify is wrong: it reads the gold `6, 6` as the set {6} and the labelled values "
               "`AB=6, CD=6` as two answers, so a correct pair of equal lengths fails")

# (family, kind, math_verify, temper) -> reason. Reviewed by reading the pairs of each kind.
REASONS = {
    ("intervals", "double_inequality", False, True): MV_INEQUALITY,
    ("intervals", "half_open_inequality", False, True): MV_INEQUALITY,
    ("intervals", "function_range", False, True): MV_INEQUALITY,
    ("intervals", "ray", False, True): MV_INEQUALITY,
    ("intervals", "union_or", False, True): MV_INEQUALITY,
    ("intervals", "decimal_endpoints", False, True): MV_ROUNDING,
    ("matrices", "rounded_gold", False, True): MV_ROUNDING,
    ("decimal_commas", "two_digit_decimal", False, True): MV_COMMA,
    ("labels", "segments", False, True): MV_REPEATED,
}


def main():
    cases_path, temper_path, out_path = sys.argv[1:4]
    cases = [json.loads(line) for line in open(cases_path)]
    verdicts = [json.loads(line) for line in open(temper_path)]
    assert len(cases) == len(verdicts), "one verdict per case"
    unreviewed = {}
    rows = []
    for c, v in zip(cases, verdicts):
        ours = bool(v["correct"])
        if ours == c["math_verify"]:
            continue
        key = (c["family"], c["kind"], c["math_verify"], ours)
        reason = REASONS.get(key)
        if reason is None:
            unreviewed.setdefault(key, []).append((c["gold"], c["pred"]))
            continue
        rows.append({"family": c["family"], "kind": c["kind"], "gold": c["gold"], "pred": c["pred"],
                     "math_verify": c["math_verify"], "sympy": c["sympy"], "temper": ours,
                     "reason": reason})
    if unreviewed:
        for key, pairs in unreviewed.items():
            print(f"unreviewed disagreement {key}: {len(pairs)} pairs, e.g. {pairs[:3]}", file=sys.stderr)
        sys.exit(1)
    with open(out_path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} reviewed disagreements of {len(cases)} pairs -> {out_path}")


if __name__ == "__main__":
    main()
