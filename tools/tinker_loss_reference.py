#!/usr/bin/env python3
"""Tinker's built-in losses computed with PyTorch from the Tinker docs' own snippets, for
temper-algo's tests: prints JSON [{"loss_fn", "config", "lp", "logprobs", "advantages", "weights",
"loss", "grad"}], where grad = d loss / d lp (float64).

Snippets (Tinker docs, losses): IS `-(exp(lp-q)*A).sum()`; PPO `ratio=exp(lp-q);
clipped=clamp(ratio, lo, hi); -min(ratio*A, clipped*A).sum()`; CISPO `-(clipped.detach()*lp*A).sum()`;
DRO `-(lp*A - 0.5*beta*(lp-q)**2).sum()`; CE `(-lp*weights).sum()`.

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
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
