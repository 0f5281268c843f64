#!/usr/bin/env python3
"""PyTorch/transformers side of `temper bench train`: times forward + backward + torch.optim.AdamW
steps of a random Qwen2-shaped model, on the same loss temper computes
(loss = -mean log p(next token), via logsumexp + gather).

Run as a worker: it builds the model once, then reads commands from stdin, one per line:
  run MODE STEPS     MODE = f32 | autocast_bf16 | compile_f32 | compile_bf16 (the compile modes
                     need --compile: the model under torch.compile); prints one JSON line
                     {"mode", "steps", "secs", "cpu_secs", "tok_s", "peak_bytes"} (cpu_secs:
                     process CPU time; peak_bytes: torch.cuda.max_memory_allocated on a GPU)
  quit
Sizes come from the command line (defaults = the benchmark's 25M model):
  .venv/bin/python tools/bench_train.py --batch 8 --seq 256 --vocab 32000 --hidden 384 --layers 6 \
      --heads 6 --kv-heads 2 --intermediate 1024
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--compile", action="store_true", help="also a torch.compile'd model (modes compile_*)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, tie_word_embeddings=True, max_position_embeddings=4096,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)  # as temper: TRL's default
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    mask = torch.ones_like(ids)
    targets = ids[:, 1:]

    # The compiled model shares the eager one's parameters (and so the optimizer).
    compiled = torch.compile(model) if args.compile else None

    def step(autocast, compile_):
        m = compiled if compile_ else model
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = m(input_ids=ids, attention_mask=mask).logits[:, :-1]
        z = logits.float()
        logp = z.gather(-1, targets[..., None])[..., 0] - z.logsumexp(-1)
        loss = -logp.mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(json.dumps({"ready": True, "params": n_params, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            break
        modes = ("f32", "autocast_bf16") + (("compile_f32", "compile_bf16") if args.compile else ())
        if parts[0] != "run" or len(parts) != 3 or parts[1] not in modes:
            print(json.dumps({"error": f"bad command {line.strip()!r}"}), flush=True)
            continue
        mode, steps = parts[1], int(parts[2])
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step(mode.endswith("bf16"), mode.startswith("compile"))
        if cuda:
            torch.cuda.synchronize(dev)
        secs, cpu_secs = time.perf_counter() - t0, time.process_time() - c0
        reply = {"mode": mode, "steps": steps, "secs": secs, "cpu_secs": cpu_secs,
                 "tok_s": steps * args.batch * args.seq / secs}
        if cuda:
            reply["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
