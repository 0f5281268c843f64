#!/usr/bin/env python3
"""transformers `generate` side of `temper bench sample`: a worker driven over stdin/stdout.

Started as `bench_sample.py --model DIR --dtype f32|bf16 [--device cuda]`; prints {"ready": true, ...} once the model is
loaded, then for each JSON line {"prompts": [[id]], "max_new_tokens": N} on stdin runs one
`model.generate` (sampling: temperature 1, top_p 1, top_k off, EOS ignored via min_new_tokens = N,
so every row makes exactly N tokens) and prints {"seconds": wall time, "new_tokens": rows * N}.
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    dev = torch.device(a.device)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(dev).eval()
    print(json.dumps({"ready": True, "threads": torch.get_num_threads(), "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ids = torch.tensor(req["prompts"], dtype=torch.long, device=dev)
        n = req["max_new_tokens"]
        torch.manual_seed(0)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=0,
            )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # generate returns before the GPU is done
        seconds = time.perf_counter() - start
        new = out.shape[1] - ids.shape[1]
        print(json.dumps({"seconds": seconds, "new_tokens": int(ids.shape[0] * new)}), flush=True)


if __name__ == "__main__":
    main()
