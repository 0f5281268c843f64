#!/usr/bin/env python3
"""Reference for temper-rollout's logits processors: transformers' own processors, run row by row.

Reads JSON on stdin: {"logits": [[float]], "rows": [{"temperature", "top_k", "top_p",
"repetition_penalty", "seen": [int], "banned": [int]}]} and prints {"logits": [[float]]} with
-inf written as null. Used live by crates/temper-rollout/tests (via .venv/bin/python).
Order = transformers' generate: repetition penalty, min-new-tokens EOS ban, temperature, top-k, top-p.
"""
import json
import math
import sys

import torch
from transformers.generation import logits_process as lp


def process_row(scores: torch.Tensor, row: dict) -> torch.Tensor:
    scores = scores.clone().unsqueeze(0)
    if row["repetition_penalty"] != 1.0 and row["seen"]:
        seen = torch.tensor([row["seen"]], dtype=torch.long)
        scores = lp.RepetitionPenaltyLogitsProcessor(row["repetition_penalty"])(seen, scores)
    if row["banned"]:
        # Zero new tokens so far, one required: every "EOS" id is banned.
        no_new_tokens = torch.zeros((1, 1), dtype=torch.long)
        scores = lp.MinNewTokensLengthLogitsProcessor(1, 1, row["banned"])(no_new_tokens, scores)
    t = row["temperature"]
    if t not in (0.0, 1.0):
        scores = lp.TemperatureLogitsWarper(t)(None, scores)
    if row["top_k"] > 0:
        scores = lp.TopKLogitsWarper(row["top_k"])(None, scores)
    if row["top_p"] < 1.0:
        scores = lp.TopPLogitsWarper(row["top_p"])(None, scores)
    return scores[0]


def main() -> None:
    case = json.load(sys.stdin)
    logits = torch.tensor(case["logits"], dtype=torch.float32)
    out = [process_row(logits[i], row) for i, row in enumerate(case["rows"])]
    rows = [[None if math.isinf(v) and v < 0 else v for v in r.tolist()] for r in out]
    json.dump({"logits": rows}, sys.stdout)


if __name__ == "__main__":
    main()
