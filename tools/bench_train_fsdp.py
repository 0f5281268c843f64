#!/usr/bin/env python3
"""PyTorch FSDP2 side of `temper bench train --nproc N --strategy fsdp`: the bench's random
Qwen2-shaped model (transformers, f32, SDPA), `fully_shard` per decoder layer and at the root, with
activation checkpointing, over N CPU processes on Gloo (one intra-op thread each unless --threads),
the same loss as temper (-sum log p(next token) over a rank's rows / the whole batch's tokens) and
torch.optim.AdamW (fused) after clip_grad_norm_. Each rank takes batch/N rows.

  python tools/bench_train_fsdp.py --nproc 2 --steps 3 --warmup 1 [--batch 8 --seq 256 ...]

Prints one JSON line: {"secs_per_step", "peak_rss_bytes" (the largest rank's peak resident set),
"params"}.
"""
import argparse
import json
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(args.seed)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, tie_word_embeddings=True, max_position_embeddings=4096,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    params = sum(p.numel() for p in model.parameters())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            fused=True)
    share = args.batch // args.nproc
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(args.vocab, (args.batch, args.seq), generator=g)[rank * share:(rank + 1) * share]
    total = args.batch * (args.seq - 1)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        # FSDP averages the ranks' gradients: scaled by N they sum.
        (-logp.sum() / total * args.nproc).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    secs = (time.perf_counter() - start) / args.steps
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put({"secs_per_step": secs, "peak_rss_bytes": int(peak.item()), "params": params})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(run, args=(args, free_port(), results), nprocs=args.nproc)
    print(json.dumps(results.get()), flush=True)


if __name__ == "__main__":
    main()
