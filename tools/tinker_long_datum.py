#!/usr/bin/env python3
"""One LoRA forward_backward of one long datum through the tinker SDK, and the server's peak
resident memory around it (Linux VmHWM of the server process, reset before the call), for the
memory check of long Tinker datums (BENCHMARKS.md, crates/temper-cli/tests/tinker_long_datum.rs).

    TINKER_BASE_URL=... TINKER_API_KEY=tml-local .venv/bin/python tools/tinker_long_datum.py \
        BASE_MODEL SERVER_PID --tokens 8192 [--rank 8] [--warm]

The long datum is the fresh client's first call, as a new user sends it; `--warm` makes one
16-token call first (what every call allocates once is then in place before the measurement).

Prints one JSON line: {"tokens", "rss_before_mib", "peak_mib", "loss", "seconds"}.
"""
import argparse
import json
import random
import time

import tinker
from tinker import types

ap = argparse.ArgumentParser()
ap.add_argument("base_model")
ap.add_argument("pid", type=int)
ap.add_argument("--tokens", type=int, default=8192)
ap.add_argument("--rank", type=int, default=8)
ap.add_argument("--vocab", type=int, default=256, help="token ids are drawn below this")
ap.add_argument("--warm", action="store_true", help="a 16-token call first")
cli = ap.parse_args()


def status(field):
    for line in open(f"/proc/{cli.pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak():
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    with open(f"/proc/{cli.pid}/clear_refs", "w") as f:
        f.write("5")


sc = tinker.ServiceClient()
tc = sc.create_lora_training_client(base_model=cli.base_model, rank=cli.rank, seed=1).result()
rng = random.Random(0)
ids = [rng.randrange(cli.vocab) for _ in range(cli.tokens + 1)]
datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * cli.tokens})
if cli.warm:
    short = types.Datum(model_input=types.ModelInput.from_ints(ids[:16]),
                        loss_fn_inputs={"target_tokens": ids[1:17], "weights": [1.0] * 16})
    tc.forward_backward([short], "cross_entropy").result()
before = status("VmRSS")
reset_peak()
t0 = time.time()
out = tc.forward_backward([datum], "cross_entropy").result()
seconds = time.time() - t0
print(json.dumps({"tokens": cli.tokens, "rss_before_mib": round(before), "peak_mib": round(status("VmHWM")),
                  "loss": out.metrics["loss:sum"], "seconds": round(seconds, 1)}))
