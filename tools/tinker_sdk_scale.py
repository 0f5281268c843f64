"""An RL-sized Tinker batch through the unmodified tinker SDK against `temper serve`.

One forward_backward of DATUMS datums x LENGTH tokens (at least 300k tokens), which the SDK cuts
into several requests by the server's /client/config, must give the same update as the same
datums sent in small calls; and a batch whose advantages are all zero returns loss 0 and leaves
the weights where they were.

  TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-local python tools/tinker_sdk_scale.py MODEL
"""
import argparse
import sys

import numpy as np
import tinker
from tinker import types
from tinker.lib.public_interfaces import training_client as tc_module

ap = argparse.ArgumentParser()
ap.add_argument("base_model")
ap.add_argument("--datums", type=int, default=300)
ap.add_argument("--length", type=int, default=1024)
ap.add_argument("--vocab", type=int, default=256)
cli = ap.parse_args()


def ok(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


rng = np.random.default_rng(0)


def datum(k, zero=False):
    tokens = rng.integers(0, cli.vocab, cli.length + 1).tolist()
    n = cli.length
    adv = np.zeros(n) if zero else rng.normal(0, 1, n) * (np.arange(n) >= n // 4)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": (-5.0 + 0.01 * rng.normal(0, 1, n)).astype(np.float32).tolist(),
            "advantages": adv.astype(np.float32).tolist(),
        },
    )


# Count the requests the SDK makes out of one forward_backward.
requests = []
original = tc_module.TrainingClient._chunked_requests_generator


def counting(self, *a, **kw):
    for chunk in original(self, *a, **kw):
        requests.append(chunk)
        yield chunk


tc_module.TrainingClient._chunked_requests_generator = counting

data = [datum(k) for k in range(cli.datums)]
tokens = sum(d.model_input.length for d in data)
sc = tinker.ServiceClient()
adam = types.AdamParams(learning_rate=10.0, beta1=0.0, beta2=0.0, eps=1e3)
probe = datum(-1)

whole = sc.create_lora_training_client(base_model=cli.base_model, rank=4, seed=5).result()
out = whole.forward_backward(data, "importance_sampling").result()
ok(len(requests) >= 2, f"one forward_backward of {cli.datums} datums, {tokens} tokens: the SDK sent {len(requests)} requests")
ok(tokens >= 300_000, f"{tokens} tokens in one call")
whole.optim_step(adam).result()
lp_whole = np.array(whole.forward([probe], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].data)

small = sc.create_lora_training_client(base_model=cli.base_model, rank=4, seed=5).result()
sums = []
for i in range(0, len(data), 10):
    sums.append(small.forward_backward(data[i:i + 10], "importance_sampling").result().metrics["loss:sum"])
small.optim_step(adam).result()
lp_small = np.array(small.forward([probe], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].data)
got, want = out.metrics["loss:sum"], sum(sums)
ok(abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"loss:sum {got:.4f} == sum of {len(sums)} small calls {want:.4f}")
diff = np.abs(lp_whole - lp_small).max()
base = sc.create_lora_training_client(base_model=cli.base_model, rank=4, seed=5).result()
lp_base = np.array(base.forward([probe], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].data)
ok(np.abs(lp_whole - lp_base).max() > 1e-4, "the update moved the weights")
ok(diff <= 1e-5, f"the update equals the same datums sent in small calls (max |logprob diff| {diff:.2e})")

# All advantages zero: loss 0, nothing added to the gradients, and the server still serves.
zero = sc.create_lora_training_client(base_model=cli.base_model, rank=4, seed=5).result()
z = zero.forward_backward([datum(k, zero=True) for k in range(4)], "importance_sampling").result()
ok(z.metrics["loss:sum"] == 0.0, "all-zero advantages: loss:sum == 0")
zero.optim_step(adam).result()
lp_zero = np.array(zero.forward([probe], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].data)
ok(np.array_equal(lp_zero, lp_base), "all-zero advantages leave the weights unchanged")
# A long prompt's sampling request at the largest widths: target_prompt_logprobs with 64 ids at
# every position (the own next token first, dense and sparse), prompt_alt_tokens_k=64 and
# topk_prompt_logprobs=64, in one call each; the own-token column equals compute_logprobs'.
import torch

prompt = rng.integers(0, cli.vocab, cli.length).tolist()
sampler = sc.create_sampling_client(base_model=cli.base_model)
own = np.array(sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()[1:], dtype=np.float64)
ids = torch.tensor(rng.integers(0, cli.vocab, (cli.length - 1, 64)), dtype=torch.int64)
ids[:, 0] = torch.tensor(prompt[1:])
params = types.SamplingParams(max_tokens=1, seed=1)
for name, td in (("dense", types.TensorData.from_torch(ids)),
                 ("sparse", types.TensorData.from_torch_sparse(ids, pad_value=-1))):
    r = sampler.sample(types.ModelInput.from_ints(prompt), 1, params, target_prompt_logprobs=td).result()
    got = r.target_prompt_logprobs.to_torch().double().numpy()
    ok(got.shape == (cli.length - 1, 64) and np.isfinite(got).all() and (got <= 0).all()
       and np.abs(got[:, 0] - own).max() <= 1e-4,
       f"target_prompt_logprobs ({name}, {got.size} cells, a {cli.length}-token prompt): own ids == compute_logprobs")
r = sampler.sample(types.ModelInput.from_ints(prompt), 1, params, prompt_alt_tokens_k=64,
                   topk_prompt_logprobs=64).result()
alt = r.prompt_alt_tokens.tokens.to_torch()
ok(tuple(alt.shape) == (cli.length - 1, 64) and len(r.topk_prompt_logprobs) == cli.length,
   f"prompt_alt_tokens_k=64 and topk_prompt_logprobs=64 on a {cli.length}-token prompt")
print("all checks passed")
