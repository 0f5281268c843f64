#!/usr/bin/env python3
"""Two training runs of the same job agree: every per-step metric (timings and perf/ aside) to
1e-4 (relative above 1) and the final checkpoint's weights to 1e-4 relative (L2). Used by
scripts/gpu-check.sh for 2 GPUs (NCCL) against 1 GPU with the same global batch: GPU reductions
are not bitwise reproducible.

  python tools/compare_runs.py RUN_A RUN_B
"""
import glob
import json
import sys

from safetensors.torch import load_file


def metrics(run):
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl")]


def weights(run):
    files = sorted(glob.glob(f"{run}/checkpoints/*/model/*.safetensors"))
    assert files, f"no checkpoint in {run}"
    w = {}
    for f in files:
        w.update(load_file(f))
    return w


def main():
    one, two = sys.argv[1], sys.argv[2]
    ma, mb = metrics(one), metrics(two)
    assert len(ma) == len(mb), (len(ma), len(mb))
    for a, b in zip(ma, mb):
        for k, v in a.items():
            if k.startswith(("timing_s/", "perf/")) or not isinstance(v, (int, float)):
                continue
            assert abs(v - b[k]) <= 1e-4 * max(1.0, abs(v)), f"step {a.get('step')}: {k}: {v} vs {b[k]}"
    wa, wb = weights(one), weights(two)
    num = sum(float((wa[k].float() - wb[k].float()).pow(2).sum()) for k in wa)
    den = sum(float(wa[k].float().pow(2).sum()) for k in wa)
    rel = (num / den) ** 0.5
    assert rel <= 1e-4, f"weights differ by {rel:.3e} (relative)"
    print(f"metrics equal over {len(ma)} steps; weights relative difference {rel:.3e}")


if __name__ == "__main__":
    main()
