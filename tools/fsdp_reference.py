#!/usr/bin/env python3
"""PyTorch FSDP2 reference for temper's sharded training (`actor.strategy = fsdp`).

  python tools/fsdp_reference.py --model DIR --batch BATCH.json --nproc N --steps S --out DIR

Loads the HF folder DIR with transformers (f32, SDPA attention), shards it with FSDP2's
`fully_shard` (each decoder layer, then the root) over N CPU processes on Gloo, and takes S steps
of torch.optim.AdamW (`foreach=False`) after `clip_grad_norm_` on a fixed batch: BATCH.json holds
{"ids": [[token, ...], ...], "lr", "betas", "eps", "weight_decay", "max_norm"}. Rank r trains the
r-th contiguous share of the rows; the loss is -sum log p(next token) over a rank's rows divided
by the whole batch's predicted tokens, and gradients are summed over the ranks (FSDP averages
them: the loss is scaled by N first), so the step is the whole batch's.
Writes OUT/steps.json ([{"loss", "grad_norm"}] per step, loss summed over the ranks) and
OUT/weights.safetensors (every parameter, whole, after the last step).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args, store):
    torch.set_num_threads(1)
    # A file rendezvous: no port picked here that another test could take meanwhile.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.nproc)
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    batch = json.load(open(args.batch))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=batch["lr"], betas=tuple(batch["betas"]), eps=batch["eps"],
                            weight_decay=batch["weight_decay"], foreach=False)
    ids = torch.tensor(batch["ids"], dtype=torch.long)
    rows, length = ids.shape
    share = rows // args.nproc
    mine = ids[rank * share:(rank + 1) * share]
    total_tokens = rows * (length - 1)
    steps = []
    for _ in range(args.steps):
        opt.zero_grad()
        logits = model(input_ids=mine).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, mine[:, 1:].unsqueeze(-1)).squeeze(-1)
        loss = -logp.sum() / total_tokens
        # FSDP averages the ranks' gradients (its divide factor needs PREMUL_SUM, which Gloo
        # lacks): scaled by the world size (a power of two, so exactly) they sum.
        (loss * args.nproc).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), batch["max_norm"])
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        steps.append({"loss": summed.item(), "grad_norm": norm.item()})
    weights = {n: p.full_tensor().detach().contiguous() for n, p in model.named_parameters()}
    if rank == 0:
        from safetensors.torch import save_file
        os.makedirs(args.out, exist_ok=True)
        save_file(weights, os.path.join(args.out, "weights.safetensors"))
        json.dump(steps, open(os.path.join(args.out, "steps.json"), "w"))
    # No rank tears its group down while another is still using it.
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(os.path.abspath(args.out), "rendezvous")
    if os.path.exists(store):
        os.remove(store)
    mp.spawn(run, args=(args, store), nprocs=args.nproc)


if __name__ == "__main__":
    main()
