"""Tinker SDK clients for `temper serve`'s load test (crates/temper-cli/tests/serve_load.rs).

Usage: tinker_load_client.py BASE_MODEL CLIENTS WARM_UP SECONDS...   (TINKER_BASE_URL,
TINKER_API_KEY set)

Each of CLIENTS threads has its own ServiceClient, a sampling client on the base model, a LoRA
training client, and a sampling client on a snapshot of that LoRA model taken after one optimizer
step (its adapters, swapped onto the server's one copy of the base between batches, so the load
mixes batches of different weights). First, with nothing else running, each records its answers to a few seeded
sample requests and the loss of a forward_backward; the script then prints READY and waits for a
line on stdin. Then each client sends WARM_UP requests, the script prints WARM and waits for a
line again (the test measures the server's memory meanwhile); then for each SECONDS, printing
`PHASE n` after each and waiting for a line before the next. The clients
cycle through base samples, snapshot samples and forward_backward, checking every answer against its recorded one (tokens
exactly, logprobs and losses to 1e-4: the answer must not depend on what else the server is
doing). No optim_step after the first, so the weights never change during the load. Prints `requests N errors E mismatches M`
(all phases) and exits 0 only when both are 0.
"""
import sys
import threading
import time

import numpy as np
import tinker
from tinker import types

BASE, CLIENTS, WARM_UP = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PHASES = [float(x) for x in sys.argv[4:]]
PROMPTS = [[72, 105, 33, 10], [50, 51, 52], [100, 101, 102, 103, 104]]


def datum():
    tokens = [72, 105, 33, 10, 50, 51, 52, 53]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]},
    )


def sample(sampler, k):
    r = sampler.sample(types.ModelInput.from_ints(PROMPTS[k]), num_samples=2,
                       sampling_params=types.SamplingParams(max_tokens=8, seed=k, temperature=1.0)).result()
    return [(list(s.tokens), np.array(s.logprobs)) for s in r.sequences]


def loss(tc):
    out = tc.forward_backward([datum()], "cross_entropy").result()
    return out.metrics["loss:sum"]


class Client:
    def __init__(self):
        sc = tinker.ServiceClient()
        self.sampler = sc.create_sampling_client(base_model=BASE).result()
        self.tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
        self.tc.forward_backward([datum()], "cross_entropy").result()
        self.tc.optim_step(types.AdamParams(learning_rate=0.1)).result()
        self.snapshot = self.tc.save_weights_and_get_sampling_client().result()
        self.refs = [sample(self.sampler, k) for k in range(len(PROMPTS))]
        self.snapshot_refs = [sample(self.snapshot, k) for k in range(len(PROMPTS))]
        # The snapshot samples other weights than the base (else a swap that went wrong could
        # not show).
        moved = max((float(np.abs(a[1] - b[1]).max())
                     for ra, rb in zip(self.refs, self.snapshot_refs) for a, b in zip(ra, rb)
                     if a[0] == b[0]), default=0.0)
        if all(a[0] == b[0] for ra, rb in zip(self.refs, self.snapshot_refs)
               for a, b in zip(ra, rb)) and moved < 1e-3:
            sys.exit(f"the LoRA snapshot samples like the base (max logprob change {moved})")
        self.ref_loss = loss(self.tc)
        self.requests = self.errors = self.mismatches = 0

    def run(self, deadline, count=None):
        i = 0
        while time.monotonic() < deadline and (count is None or i < count):
            i += 1
            try:
                if i % 3 != 0:
                    k = i % len(PROMPTS)
                    sampler, refs = ((self.sampler, self.refs) if i % 3 == 1
                                     else (self.snapshot, self.snapshot_refs))
                    got = sample(sampler, k)
                    same = all(t == rt and np.allclose(lp, rlp, atol=1e-4)
                               for (t, lp), (rt, rlp) in zip(got, refs[k]))
                else:
                    same = abs(loss(self.tc) - self.ref_loss) <= 1e-4 * max(1.0, abs(self.ref_loss))
                self.requests += 1
                if not same:
                    self.mismatches += 1
                    print(f"mismatch on request {i}", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - counted and reported
                self.errors += 1
                print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def run_all(deadline, count=None):
    threads = [threading.Thread(target=c.run, args=(deadline, count)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


clients = [Client() for _ in range(CLIENTS)]
print("READY", flush=True)
sys.stdin.readline()
run_all(float("inf"), WARM_UP)
print("WARM", flush=True)
for n, seconds in enumerate(PHASES):
    sys.stdin.readline()
    run_all(time.monotonic() + seconds)
    if n + 1 < len(PHASES):
        print(f"PHASE {n + 1}", flush=True)
requests = sum(c.requests for c in clients)
errors = sum(c.errors for c in clients)
mismatches = sum(c.mismatches for c in clients)
print(f"requests {requests} errors {errors} mismatches {mismatches}", flush=True)
sys.exit(0 if errors == 0 and mismatches == 0 else 1)
