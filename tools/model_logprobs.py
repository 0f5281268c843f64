#!/usr/bin/env python3
"""Per-token logprobs of token-id rows under an HF folder, computed by transformers.

Usage: .venv/bin/python tools/model_logprobs.py --model DIR --rows '[[1,2,3],[4,5]]'
Prints JSON: {"logp": [[...n-1...], ...], "entropy": [[...]], "top_next": [[[id, logp] x5], ...]}
(logp[t] = log p(ids[t+1] | ids[..=t]); top_next: the 5 likeliest tokens after the last id).
Used by temper-model's save round-trip test and to cross-check `temper score`.
"""
import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True, help="JSON list of lists of token ids")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    out = {"logp": [], "entropy": [], "top_next": []}
    with torch.no_grad():
        for ids in json.loads(args.rows):
            logp_all = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            targets = torch.tensor(ids[1:], dtype=torch.long)
            out["logp"].append(logp_all[:-1].gather(-1, targets[:, None])[:, 0].tolist())
            out["entropy"].append((-(logp_all.exp() * logp_all).sum(-1))[:-1].tolist())
            top = torch.topk(logp_all[-1], 5)
            out["top_next"].append([[int(i), float(v)] for v, i in zip(top.values, top.indices)])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
