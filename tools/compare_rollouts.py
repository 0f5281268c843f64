#!/usr/bin/env python3
"""How two runs of the same job differ, step by step: their rollouts (rollouts/step_*.jsonl: the
rows with the same tokens, the fields that differ, the largest logprob difference on equal tokens)
and their metrics (metrics.jsonl, timings and perf/ aside: every key whose value differs, and keys
only one side has). For checking that a change preserves behaviour (issue 25's before/after
recordings: BENCHMARKS.md, "One home for each thing: before and after").

  python tools/compare_rollouts.py RUN_A RUN_B

Prints a report; exits 0 (a comparison, not a verdict).
"""
import glob
import json
import os
import sys

LOGPROB_FIELDS = ("old_logprobs", "rollout_logprobs", "logprobs")


def rows(path):
    return [json.loads(line) for line in open(path)]


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    steps = sorted(
        int(os.path.basename(p)[len("step_") : -len(".jsonl")])
        for p in glob.glob(f"{a_dir}/rollouts/step_*.jsonl")
    )
    for step in steps:
        a = rows(f"{a_dir}/rollouts/step_{step}.jsonl")
        b_path = f"{b_dir}/rollouts/step_{step}.jsonl"
        if not os.path.exists(b_path):
            print(f"step {step}: only in {a_dir}")
            continue
        b = rows(b_path)
        identical = open(f"{a_dir}/rollouts/step_{step}.jsonl", "rb").read() == open(b_path, "rb").read()
        same_tokens = sum(x.get("completion_ids") == y.get("completion_ids") for x, y in zip(a, b))
        differing, worst = {}, 0.0
        for x, y in zip(a, b):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    differing[k] = differing.get(k, 0) + 1
            if x.get("completion_ids") == y.get("completion_ids"):
                for k in LOGPROB_FIELDS:
                    if isinstance(x.get(k), list) and isinstance(y.get(k), list):
                        worst = max([worst] + [abs(p - q) for p, q in zip(x[k], y[k])])
        print(
            f"step {step}: {'byte-identical' if identical else 'differs'}; {len(a)} vs {len(b)} rows, "
            f"{same_tokens} with the same tokens; fields differing (rows): {differing or 'none'}; "
            f"largest logprob difference on equal tokens {worst:.3g}"
        )
    ma, mb = rows(f"{a_dir}/metrics.jsonl"), rows(f"{b_dir}/metrics.jsonl")
    skip = ("timing_s/", "perf/")
    for x, y in zip(ma, mb):
        diffs = []
        for k, v in x.items():
            if k.startswith(skip) or not isinstance(v, (int, float)):
                continue
            if k not in y:
                diffs.append(f"{k}: only in A")
            elif v != y[k]:
                rel = abs(v - y[k]) / max(1.0, abs(v))
                diffs.append(f"{k}: {v:.9g} vs {y[k]:.9g} (rel {rel:.1e})")
        only_b = [k for k in y if k not in x and not k.startswith(skip)]
        print(f"metrics of step {x.get('step')}: {len(diffs)} differ" + "".join(f"\n    {d}" for d in diffs)
              + (f"\n    only in B: {only_b}" if only_b else ""))
    if len(ma) != len(mb):
        print(f"metrics: {len(ma)} vs {len(mb)} lines")


if __name__ == "__main__":
    main()
