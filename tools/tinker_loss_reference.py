#!/usr/bin/env python3
"""Tinker's built-in losses computed with PyTorch from the Tinker docs' own snippets, for
temper-algo's tests: prints JSON [{"loss_fn", "config", "lp", "logprobs", "advantages", "weights",
"mask", "recorded", "loss", "grad"}], where grad = d loss / d lp (float64).

Snippets (Tinker docs, losses): IS `-(exp(lp-q)*A).sum()`; PPO `ratio=exp(lp-q);
clipped=clamp(ratio, lo, hi); -min(ratio*A, clipped*A).sum()`; CISPO `-(clipped.detach()*lp*A).sum()`;
DRO `-(lp*A - 0.5*beta*(lp-q)**2).sum()`; CE `(-lp*weights).sum()`; GSPO (GSPO-token, `mask` is
`sequence_ratio_mask`) `log_ratio=(lp.detach()-q)[mask!=0].mean(); ratio=exp(log_ratio+lp-lp.detach());
-min(ratio*A, clamp(ratio, lo, hi)*A).sum()`.

`stable_reinforce` has no published formula; this is temper's reading (docs/tinker.md), written
here from its definition: over the positions whose target is a sampled token (`mask`), with the
sampler's recorded logprobs `recorded`, `r=exp(lp-recorded)`,
`-(min(r, cap).detach()*lp*A).sum() + kl_coeff*(r-1-log r).sum()`.

Usage: .venv/bin/python tools/tinker_loss_reference.py
"""
import json

import torch


def loss_of(name, cfg, lp, q, a, w):
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    if name == "cross_entropy":
        return (-lp * w).sum()
    ratio = torch.exp(lp - q)
    if name == "importance_sampling":
        return -(ratio * a).sum()
    if name == "ppo":
        clipped = torch.clamp(ratio, lo, hi)
        return -torch.min(ratio * a, clipped * a).sum()
    if name == "cispo":
        clipped = torch.clamp(ratio, lo, hi)
        return -(clipped.detach() * lp * a).sum()
    if name == "dro":
        beta = cfg["beta"]
        return -(lp * a - 0.5 * beta * (lp - q) ** 2).sum()
    raise ValueError(name)


def gspo(cfg, lp, q, a, mask):
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    log_ratio = (lp.detach() - q)[mask != 0].mean()
    ratio = torch.exp(log_ratio + lp - lp.detach())
    return -torch.min(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()


def stable_reinforce(cfg, lp, recorded, a, mask):
    keep = mask != 0
    lp, recorded, a = lp[keep], recorded[keep], a[keep]
    r = torch.exp(lp - recorded)
    cap, kl = cfg.get("ratio_cap", 2.0), cfg.get("kl_coeff", 0.0)
    return -(torch.clamp(r, max=cap).detach() * lp * a).sum() + kl * (r - 1 - torch.log(r)).sum()


def main():
    g = torch.Generator().manual_seed(0)
    cases = []
    configs = [
        ("cross_entropy", {}),
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
        ("cispo", {}),
        ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
        ("dro", {"beta": 0.05}),
        ("dro", {"beta": 1.3}),
    ]
    for seed in range(4):
        n = 5 + 3 * seed
        q = -torch.rand(n, generator=g, dtype=torch.float64) * 3
        # Ratios spread across and beyond the clip range; the last round has log-ratios beyond
        # +-20, where verl's losses clamp and Tinker's formulas do not.
        lp0 = q + torch.randn(n, generator=g, dtype=torch.float64) * (0.4 if seed < 3 else 15.0)
        a = torch.randn(n, generator=g, dtype=torch.float64)
        w = torch.randn(n, generator=g, dtype=torch.float64)  # negative weights too
        for name, cfg in configs:
            lp = lp0.clone().requires_grad_(True)
            loss = loss_of(name, cfg, lp, q, a, w)
            loss.backward()
            cases.append({"loss_fn": name, "config": cfg, "lp": lp0.tolist(), "logprobs": q.tolist(),
                          "advantages": a.tolist(), "weights": w.tolist(), "loss": loss.item(),
                          "grad": lp.grad.tolist()})
        # A prompt of 3 positions (mask 0, advantage 0), then sampled tokens (mask 1).
        mask = torch.tensor([0.0] * 3 + [1.0] * (n - 3), dtype=torch.float64)
        a_sampled = a * mask
        recorded = (q + torch.randn(n, generator=g, dtype=torch.float64) * 0.3) * mask
        for cfg in [{}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}]:
            lp = lp0.clone().requires_grad_(True)
            loss = gspo(cfg, lp, q, a, mask)
            loss.backward()
            cases.append({"loss_fn": "gspo", "config": cfg, "lp": lp0.tolist(), "logprobs": q.tolist(),
                          "advantages": a.tolist(), "weights": w.tolist(), "mask": mask.tolist(),
                          "recorded": recorded.tolist(), "loss": loss.item(),
                          "grad": lp.grad.tolist()})
        for cfg in [{}, {"kl_coeff": 0.1}, {"kl_coeff": 0.02, "ratio_cap": 1.3}]:
            lp = lp0.clone().requires_grad_(True)
            loss = stable_reinforce(cfg, lp, recorded, a_sampled, mask)
            loss.backward()
            cases.append({"loss_fn": "stable_reinforce", "config": cfg, "lp": lp0.tolist(),
                          "logprobs": q.tolist(), "advantages": a_sampled.tolist(),
                          "weights": w.tolist(), "mask": mask.tolist(),
                          "recorded": recorded.tolist(), "loss": loss.item(),
                          "grad": lp.grad.tolist()})
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
