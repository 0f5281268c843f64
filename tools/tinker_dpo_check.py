#!/usr/bin/env python3
"""DPO through the tinker SDK's `forward_backward_custom` (as tinker-cookbook's preference
recipes train) against the same DPO loss in PyTorch on the same model, full fine-tune:

- the server: a rank-0 (every weight) training client of MODEL_DIR; per pair, the chosen and the
  rejected completion of a prompt, the reference logprobs from a base-model sampler's
  `compute_logprobs`; `forward_backward_custom` with the DPO loss, then `optim_step`;
- PyTorch: transformers loads MODEL_DIR, the same loss on the same datums, `backward`, and
  `torch.optim.AdamW` with the same AdamParams steps.

DPO: `-logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`, each term the sum of the
completion tokens' logprobs, averaged over pairs. Checks the loss value (1e-4), and the
logprobs of a probe after one step (to 1e-3 of how far the step moved them).

    TINKER_BASE_URL=... TINKER_API_KEY=tml-local .venv/bin/python tools/tinker_dpo_check.py MODEL_DIR
"""
import sys

import numpy as np
import tinker
import torch
import torch.nn.functional as F
from tinker import types
from transformers import AutoModelForCausalLM

BASE = sys.argv[1]
BETA = 0.1
# With betas 0 and an eps far above every gradient, a step is -lr * g / (|g| + eps): linear in
# the gradient, so the comparison checks the gradient itself (no sign flips of tiny components).
ADAM = dict(learning_rate=10.0, beta1=0.0, beta2=0.0, eps=1e3, weight_decay=0.0)


def ok(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


# (prompt, chosen, rejected) token ids
PAIRS = [([72, 105, 33, 10], [50, 61, 52, 10], [40, 41, 42]),
         ([12, 200, 7], [9, 9, 30, 31, 10], [77, 10])]


def datum(prompt, completion):
    full = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "weights": weights})


data = [d for p, c, r in PAIRS for d in (datum(p, c), datum(p, r))]
sc = tinker.ServiceClient()
ref_sampler = sc.create_sampling_client(base_model=BASE).result()
ref = []
for d in data:
    toks = list(d.model_input.to_ints()) + [int(d.loss_fn_inputs["target_tokens"].data[-1])]
    lp = ref_sampler.compute_logprobs(types.ModelInput.from_ints(toks)).result()[1:]
    w = np.asarray(d.loss_fn_inputs["weights"].data)
    ref.append(float((np.asarray(lp) * w).sum()))


def dpo(data, logprobs_list):
    seq = [(lp * torch.tensor(np.asarray(d.loss_fn_inputs["weights"].data), dtype=lp.dtype)).sum()
           for d, lp in zip(data, logprobs_list)]
    losses = []
    for i in range(0, len(seq), 2):
        margin = (seq[i] - ref[i]) - (seq[i + 1] - ref[i + 1])
        losses.append(-F.logsigmoid(BETA * margin))
    loss = torch.stack(losses).mean()
    return loss, {"dpo_loss": loss.item()}


tc = sc.create_lora_training_client(base_model=BASE, rank=0, seed=1).result()
out = tc.forward_backward_custom(data, dpo).result()
tc.optim_step(types.AdamParams(**ADAM)).result()

# PyTorch: the same loss and step on transformers' copy of the model.
hf = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)


def torch_logprobs(model, d):
    ids = torch.tensor([list(d.model_input.to_ints())])
    tgt = torch.tensor(np.asarray(d.loss_fn_inputs["target_tokens"].data))
    return torch.log_softmax(model(ids).logits[0].float(), -1).gather(1, tgt[:, None])[:, 0]


loss, _ = dpo(data, [torch_logprobs(hf, d) for d in data])
ok(abs(loss.item() - out.metrics["dpo_loss"]) < 1e-4,
   f"DPO loss {out.metrics['dpo_loss']:.6f} == PyTorch's {loss.item():.6f}")
opt = torch.optim.AdamW(hf.parameters(), lr=ADAM["learning_rate"], betas=(ADAM["beta1"], ADAM["beta2"]),
                        eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
loss.backward()
opt.step()

probe = datum([72, 105, 33, 10, 50], [61, 52, 10, 40])
server = np.asarray(tc.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data)
before = np.asarray(ref_sampler.compute_logprobs(
    types.ModelInput.from_ints(list(probe.model_input.to_ints()) + [40])).result()[1:])
with torch.no_grad():
    after = torch_logprobs(hf, probe).numpy()
moved = np.abs(after - before).max()
gap = np.abs(server - after).max()
ok(moved > 1e-4 and gap <= 1e-3 * moved + 1e-6,
   f"after one AdamW step the server's logprobs == PyTorch's (step moved them {moved:.2e}, differ by {gap:.1e})")
print("all checks passed")
