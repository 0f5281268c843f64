"""The numbers the tinker SDK gets from a server, as one JSON object, for comparing two builds of
`temper serve` (issue 25's before/after recordings, BENCHMARKS.md): per Tinker loss, forward's
loss and logprobs on two datums, forward_backward's loss and the logprobs after an optim_step;
the base model's compute_logprobs; three seeded samples from the base model and from the trained
LoRA snapshot.

  TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-local python tools/tinker_sdk_numbers.py BASE_MODEL
  python tools/tinker_sdk_numbers.py --compare A.json B.json   # per key: equal, or the largest difference
"""
import json
import sys

import tinker
from tinker import types

def flat(x):
    return [v for item in x for v in flat(item)] if isinstance(x, list) else [x]


def compare(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            print(f"{k}: only in {'A' if k in a else 'B'}")
            continue
        fa, fb = flat(a[k]), flat(b[k])
        if fa == fb:
            print(f"{k}: equal")
        elif len(fa) != len(fb) or any((p is None) != (q is None) for p, q in zip(fa, fb)):
            print(f"{k}: different shapes")
        else:
            worst = max(abs(p - q) for p, q in zip(fa, fb) if p is not None)
            print(f"{k}: largest difference {worst:.3g}")


if sys.argv[1] == "--compare":
    compare(sys.argv[2], sys.argv[3])
    sys.exit(0)
BASE = sys.argv[1]
out = {}
def arr(x):
    return [float(v) for v in (x.data if hasattr(x, "data") else x)]
def datum(prompt, completion, ce=False):
    full = prompt + completion
    n = len(full) - 1
    if ce:
        inputs = {"target_tokens": full[1:], "weights": [0.0] * (len(prompt) - 1) + [1.0] * len(completion)}
    else:
        inputs = {"target_tokens": full[1:], "logprobs": [-1.0] * n,
                  "advantages": [0.0] * (len(prompt) - 1) + [(k + 1) / 3 for k in range(len(completion))]}
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)

sc = tinker.ServiceClient()
prompt, completion = [72, 105, 33, 10, 50, 1000, 2000], [43, 50, 61, 52, 300, 301]
configs = {"cross_entropy": {}, "importance_sampling": {}, "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
           "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "dro": {"beta": 0.05}}
tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
for name, cfg in configs.items():
    d = datum(prompt, completion, ce=(name == "cross_entropy"))
    r = tc.forward([d, d], name, loss_fn_config=cfg or None).result()
    out[f"forward/{name}/loss"] = r.metrics["loss:sum"]
    out[f"forward/{name}/logprobs"] = arr(r.loss_fn_outputs[0]["logprobs"])
adam = types.AdamParams(learning_rate=1e-3)
for name, cfg in configs.items():
    d = datum(prompt, completion, ce=(name == "cross_entropy"))
    r = tc.forward_backward([d], name, loss_fn_config=cfg or None).result()
    out[f"fb/{name}/loss"] = r.metrics["loss:sum"]
    tc.optim_step(adam).result()
    r = tc.forward([datum(prompt, completion, ce=True)], "cross_entropy").result()
    out[f"after/{name}/logprobs"] = arr(r.loss_fn_outputs[0]["logprobs"])
trained = tc.save_weights_and_get_sampling_client(name="snap").result()
base = sc.create_sampling_client(base_model=BASE).result()
out["base/compute_logprobs"] = base.compute_logprobs(types.ModelInput.from_ints(prompt + completion)).result()
for label, s in [("base", base), ("trained", trained)]:
    r = s.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=3,
                 sampling_params=types.SamplingParams(max_tokens=16, temperature=1.0, seed=7)).result()
    out[f"sample/{label}/tokens"] = [list(q.tokens) for q in r.sequences]
    out[f"sample/{label}/logprobs"] = [list(q.logprobs) for q in r.sequences]
print(json.dumps(out))
