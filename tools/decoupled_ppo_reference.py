#!/usr/bin/env python3
"""AReaL's decoupled PPO objective, written with PyTorch from the AReaL paper (Fu et al. 2025,
"AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", the
decoupled PPO objective), for temper-algo's tests/decoupled.rs. Prints JSON cases
[{"eps_low", "eps_high", "cap", "cap_mode", "versions", "lp", "prox", "behav", "adv", "mask",
"loss", "grad"}], grad = d loss / d lp (float64).

Each token a_t of an answer was sampled by the behaviour policy of its own version v_t (partial
rollouts: the weights changed while the answer was being written, so versions differ within a
row); pi_prox is the policy the trainer recomputes before the update and pi_theta the one being
trained:

    J(theta) = E[ sum_t  w_t * min(u_t A_t, clip(u_t, 1 - eps_low, 1 + eps_high) A_t) ],
    u_t = pi_theta(a_t) / pi_prox(a_t),   w_t = pi_prox(a_t) / pi_behav_{v_t}(a_t),

the loss -J averaged over the answers' tokens (token-mean). The behaviour weight is capped at C
in one of two ways: "truncate" (w = min(w, C), truncated importance sampling) or "drop" (a token
whose w exceeds C gets weight 0 and keeps its place in the mean: AReaL's behav_imp_weight_cap,
"filter out the tokens where behav_imp_weight exceeds the cap").

Usage: .venv/bin/python tools/decoupled_ppo_reference.py
"""
import json

import torch

torch.manual_seed(20251129)
ROWS, T, VOCAB, VERSIONS = 5, 9, 13, 4


def policies():
    """Logits of VERSIONS behaviour policies and of the proximal policy (the newest, moved a
    little further), and of pi_theta, per (row, position)."""
    base = torch.randn(ROWS, T, VOCAB, dtype=torch.float64)
    steps = [base]
    for _ in range(VERSIONS):
        steps.append(steps[-1] + 0.35 * torch.randn(ROWS, T, VOCAB, dtype=torch.float64))
    behaviour = torch.stack(steps[:VERSIONS])  # versions 0..VERSIONS-1
    prox = steps[VERSIONS]
    theta = prox + 0.3 * torch.randn(ROWS, T, VOCAB, dtype=torch.float64)
    return behaviour, prox, theta


def case(eps_low, eps_high, cap, cap_mode):
    behaviour, prox_logits, theta_logits = policies()
    # Each row's tokens were sampled under versions that grow along the row (a partial rollout
    # crossing weight updates), starting at a random version.
    start = torch.randint(0, VERSIONS, (ROWS, 1))
    bumps = (torch.rand(ROWS, T) < 0.3).long().cumsum(-1)
    versions = (start + bumps).clamp(max=VERSIONS - 1)
    tokens = torch.randint(0, VOCAB, (ROWS, T))
    lengths = torch.tensor([T, 6, 1, 4, 8])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    pick = lambda logits: torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    behav_all = torch.stack([pick(behaviour[v]) for v in range(VERSIONS)])
    behav = behav_all.gather(0, versions[None])[0]
    prox = pick(prox_logits)
    lp = pick(theta_logits).clone().requires_grad_(True)
    adv = torch.randn(ROWS, 1, dtype=torch.float64).expand(ROWS, T).contiguous()

    w = torch.exp(prox - behav)
    if cap_mode == "truncate":
        w = torch.clamp(w, max=cap)
    else:
        w = torch.where(w <= cap, w, torch.zeros_like(w))
    u = torch.exp(lp - prox)
    objective = w * torch.min(u * adv, torch.clamp(u, 1 - eps_low, 1 + eps_high) * adv)
    loss = -(objective * mask).sum() / mask.sum()
    loss.backward()
    flat = lambda t: t.detach().reshape(-1).tolist()
    return {
        "eps_low": eps_low, "eps_high": eps_high, "cap": cap, "cap_mode": cap_mode,
        "rows": ROWS, "versions": flat(versions.double()), "lp": flat(lp), "prox": flat(prox),
        "behav": flat(behav), "adv": flat(adv), "mask": flat(mask), "loss": loss.item(),
        "grad": flat(lp.grad),
    }


cases = [case(lo, hi, cap, mode)
         for (lo, hi) in [(0.2, 0.2), (0.2, 0.28)]
         for cap in [1.5, 5.0]
         for mode in ["truncate", "drop"]]
print(json.dumps(cases))
