#!/usr/bin/env python3
"""Per-token logprobs of token-id rows under an HF folder, computed by transformers.

Usage: .venv/bin/python tools/model_logprobs.py --model DIR --rows '[[1,2,3],[4,5]]'
Prints JSON: {"logp": [[...n-1...], ...], "entropy": [[...]], "top_next": [[[id, logp] x5], ...]}
(logp[t] = log p(ids[t+1] | ids[..=t]); top_next: the 5 likeliest tokens after the last id).
Used by temper-model's save round-trip test and to cross-check `temper score`.

With --worker it loads the model, prints {"ready": true}, then answers each stdin line (a JSON
list of rows) with one such JSON line: `temper check-logprobs --vs-transformers` drives it.
--device (cpu, cuda, cuda:N), --dtype (f32; bf16 = f32 weights under bf16 autocast, as temper's
bf16 compute) and --temperature (logits / T before the softmax) choose how it computes.
"""
import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def score(model, rows, device, bf16, temperature):
    out = {"logp": [], "entropy": [], "top_next": []}
    with torch.no_grad():
        for ids in rows:
            x = torch.tensor([ids], device=device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x).logits[0]
            logp_all = torch.log_softmax(logits.float() / temperature, -1)
            targets = x[0, 1:]
            out["logp"].append(logp_all[:-1].gather(-1, targets[:, None])[:, 0].tolist())
            out["entropy"].append((-(logp_all.exp() * logp_all).sum(-1))[:-1].tolist())
            top = torch.topk(logp_all[-1], 5)
            out["top_next"].append([[int(i), float(v)] for v, i in zip(top.values, top.indices)])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", help="JSON list of lists of token ids")
    ap.add_argument("--worker", action="store_true", help="answer one JSON rows list per stdin line")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    model.eval()
    bf16 = args.dtype == "bf16"
    if not args.worker:
        print(json.dumps(score(model, json.loads(args.rows), device, bf16, args.temperature)))
        return
    print(json.dumps({"ready": True, "device": str(device), "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = score(model, json.loads(line), device, bf16, args.temperature)
        except Exception as e:  # the driver reports it
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
