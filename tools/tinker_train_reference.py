#!/usr/bin/env python3
"""An independent Tinker training step for temper-tinker's tests: transformers runs the model
folder, the loss is the Tinker docs' snippet for `loss_fn`, summed over datums, and
torch.optim.AdamW with Tinker's AdamParams takes one step.

Reads a JSON list on stdin, each {"model": DIR, "loss_fn": NAME, "config": {...}, "adam": {...},
"data": [{"model_input": [...], "target_tokens": [...], "weights"|"logprobs"|"advantages": [...]}]}
Prints a JSON list, each {"logprobs": [[...]] (per datum, before the step), "loss": float,
"grads": {name: [flat values]} for every parameter, "after": [[...]] (logprobs after the step)}.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def target_logprobs(model, d):
    x = torch.tensor([d["model_input"]])
    logits = model(input_ids=x).logits.float()[0]
    lp = torch.log_softmax(logits, -1)
    return lp.gather(-1, torch.tensor(d["target_tokens"])[:, None])[:, 0]


def datum_loss(name, cfg, lp, d):
    if name == "cross_entropy":
        return (-lp * torch.tensor(d["weights"])).sum()
    q, a = torch.tensor(d["logprobs"]), torch.tensor(d["advantages"])
    ratio = torch.exp(lp - q)
    lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    if name == "importance_sampling":
        return -(ratio * a).sum()
    if name == "ppo":
        return -torch.min(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()
    if name == "cispo":
        return -(torch.clamp(ratio, lo, hi).detach() * lp * a).sum()
    if name == "dro":
        return -(lp * a - 0.5 * cfg.get("beta", 0.05) * (lp - q) ** 2).sum()
    raise ValueError(name)


def run(req):
    model = AutoModelForCausalLM.from_pretrained(req["model"], dtype=torch.float32)
    lps = [target_logprobs(model, d) for d in req["data"]]
    loss = sum(datum_loss(req["loss_fn"], req["config"], lp, d) for lp, d in zip(lps, req["data"]))
    loss.backward()
    grads = {n: p.grad.flatten().tolist() for n, p in model.named_parameters() if p.grad is not None}
    a = req["adam"]
    opt = torch.optim.AdamW(model.parameters(), lr=a["learning_rate"], betas=(a["beta1"], a["beta2"]),
                            eps=a["eps"], weight_decay=a["weight_decay"])
    opt.step()
    with torch.no_grad():
        after = [target_logprobs(model, d).tolist() for d in req["data"]]
    return {"logprobs": [lp.tolist() for lp in lps], "loss": loss.item(), "grads": grads, "after": after}


def main():
    print(json.dumps([run(r) for r in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
