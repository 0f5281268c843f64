#!/usr/bin/env python3
"""Where transformers' decode spends its time, f32 against bf16, and under each attention
backend: tok/s of `generate` (sampling, EOS banned) per configuration, then torch.profiler's top
kernels for the f32 and bf16 runs. On the H100 (docs/gpu-runs/2026-11-26-h100) bf16 decoded about
4x slower than f32 for both temper and transformers; this names what the bf16 step adds.

  python tools/decode_profile.py --model DIR [--device cuda] [--batch 1] [--new-tokens 32]
"""
import argparse
import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    models = {name: AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(dev).eval()
              for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16))}
    vocab = models["f32"].config.vocab_size
    ids = torch.randint(100, vocab, (args.batch, args.prompt_len), device=dev)
    eos = models["f32"].generation_config.eos_token_id
    bad = [[e] for e in (eos if isinstance(eos, list) else [eos])] if eos is not None else None

    def generate(model, n):
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                  max_new_tokens=n, min_new_tokens=n, bad_words_ids=bad,
                                  pad_token_id=0)

    def rate(model, backend=None):
        ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
        with ctx:
            generate(model, 2)
            sync()
            t0 = time.perf_counter()
            generate(model, 1)
            sync()
            t1 = time.perf_counter()
            generate(model, args.new_tokens)
            sync()
            t2 = time.perf_counter()
        return args.batch * (args.new_tokens - 1) / max(1e-9, (t2 - t1) - (t1 - t0))

    backends = [None, SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION,
                SDPBackend.CUDNN_ATTENTION]
    print(f"decode tok/s, batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
          f"torch {torch.__version__}, {dev}")
    for name, model in models.items():
        for b in backends:
            label = "default" if b is None else b.name.lower()
            try:
                print(f"  {name:5} {label:20} {rate(model, b):10.1f}")
            except Exception as e:  # a backend this dtype or device does not support
                print(f"  {name:5} {label:20} unsupported ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sort = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
    for name, model in models.items():
        generate(model, 2)
        with torch.profiler.profile(activities=acts) as prof:
            generate(model, args.new_tokens)
            sync()
        print(f"\n== {name}: top operators by {sort} over {args.new_tokens} decode steps")
        print(prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
