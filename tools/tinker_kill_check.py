"""A `temper serve` killed with SIGKILL while it trains loses nothing that save_state wrote
(crates/temper-cli/tests/tinker_sdk.rs drives both phases, with the unmodified tinker SDK).

  save BASE OUT:   a LoRA client trains a step, save_state("ckpt") (the state's path and its
                   forward logprobs go to OUT), then submits a long RL-sized forward_backward and
                   a second save_state("ckpt") behind it, prints BUSY and waits to be killed.
  resume BASE OUT: on a new server, create_training_client_from_state_with_optimizer(path) and
                   load_state: the forward logprobs are exactly the saved ones.

  TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-local python tools/tinker_kill_check.py ...
"""
import json
import sys
import time

import numpy as np
import tinker
from tinker import types

MODE, BASE, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
rng = np.random.default_rng(0)


def ok(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


def datum(length):
    tokens = rng.integers(0, 256, length + 1).tolist()
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": np.full(length, -5.0, dtype=np.float32).tolist(),
            "advantages": rng.normal(0, 1, length).astype(np.float32).tolist(),
        },
    )


probe = [datum(16)]


def logprobs(tc):
    x = tc.forward(probe, "importance_sampling").result().loss_fn_outputs[0]["logprobs"]
    return np.asarray(x.data if hasattr(x, "data") else x, dtype=np.float64).tolist()


sc = tinker.ServiceClient()
if MODE == "save":
    tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
    tc.forward_backward(probe, "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_state("ckpt").result().path
    with open(OUT, "w") as f:
        json.dump({"path": path, "logprobs": logprobs(tc)}, f)
    # A long forward_backward, then a save of the same name that would replace the first one.
    tc.forward_backward([datum(1024) for _ in range(200)], "importance_sampling")
    tc.optim_step(types.AdamParams(learning_rate=1e-1))
    tc.save_state("ckpt")
    print("BUSY", flush=True)
    time.sleep(600)
else:
    saved = json.load(open(OUT))
    tc = sc.create_training_client_from_state_with_optimizer(saved["path"]).result()
    ok(logprobs(tc) == saved["logprobs"], f"{saved['path']} reloads with the saved logprobs")
    tc.forward_backward(probe, "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    tc.load_state(saved["path"]).result()
    ok(logprobs(tc) == saved["logprobs"], "load_state after more training restores them")
    print("all checks passed", flush=True)
