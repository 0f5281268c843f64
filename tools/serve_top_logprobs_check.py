#!/usr/bin/env python3
"""Top-k logprobs of `temper serve`'s OpenAI and SGLang routes against transformers running the same
model folder: vLLM's completions `logprobs: k` and `prompt_logprobs: k`, chat's `top_logprobs`,
SGLang's `top_logprobs_num`. Every listed (token, logprob) must be transformers' log_softmax of
that token at that position (1e-4), the top-k values must be transformers' k largest, each
prompt token's rank must be transformers' rank, and k above 20 must be refused (400).

    .venv/bin/python tools/serve_top_logprobs_check.py URL MODEL_DIR

Prints one line per check and exits non-zero on the first failure.
"""
import json
import sys
import urllib.error
import urllib.request

import torch
from transformers import AutoModelForCausalLM

URL, MODEL = sys.argv[1], sys.argv[2]
hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)


def ok(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)
    print(f"ok   {what}", flush=True)


def post(route, body):
    req = urllib.request.Request(URL + route, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        return 200, json.load(urllib.request.urlopen(req))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def reference(tokens):
    """Row i: log_softmax of the logits after tokens[: i + 1] (predicts tokens[i + 1])."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([tokens])).logits[0].double(), -1)


def top_ok(ref_row, pairs, k):
    """`pairs` ((id, lp), ...) are ref_row's k largest: each lp is its token's, values the top k."""
    best = sorted(ref_row.tolist(), reverse=True)[:k]
    got = sorted((lp for _, lp in pairs), reverse=True)
    return (len(got) == k and all(abs(lp - ref_row[i].item()) < 1e-4 for i, lp in pairs)
            and all(abs(a - b) < 1e-4 for a, b in zip(got, best)))


prompt = [72, 105, 33, 10, 50, 61]
K = 4
code, r = post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "seed": 3, "temperature": 1.0,
                                   "logprobs": K, "prompt_logprobs": 2})
ok(code == 200, f"completions with logprobs={K}, prompt_logprobs=2: {code}")
c = r["choices"][0]
completion = c["token_ids"]
ref = reference(prompt + completion)
tops = c["logprobs"]["top_logprobs"]
ok(len(tops) == len(completion), "one top_logprobs entry per generated token")
good = True
for j, (entry, tok) in enumerate(zip(tops, completion)):
    row = ref[len(prompt) + j - 1]
    pairs = [(int(key.split(":")[1]), lp) for key, lp in entry.items()]
    best = sorted(pairs, key=lambda p: -p[1])[:K]  # the sampled token is listed besides the top K
    good &= tok in dict(pairs) and all(abs(lp - row[i].item()) < 1e-4 for i, lp in pairs)
    good &= top_ok(row, best, K)
ok(good, f"completions top_logprobs: the {K} most likely and the sampled token, transformers' logprobs")
pl = c["prompt_logprobs"]
good = pl[0] is None and len(pl) == len(prompt)
for i in range(1, len(prompt)):
    row = ref[i - 1]
    entry = {int(k): v for k, v in pl[i].items()}
    own = entry[prompt[i]]
    rank = int((row > row[prompt[i]]).sum().item()) + 1
    good &= abs(own["logprob"] - row[prompt[i]].item()) < 1e-4 and own["rank"] == rank
    good &= all(abs(v["logprob"] - row[t].item()) < 1e-4 for t, v in entry.items())
ok(good, "completions prompt_logprobs: the prompt token's logprob and rank, and the top 2, transformers'")
code, r = post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "logprobs": 21})
ok(code == 400 and "max_logprobs" in json.dumps(r), f"logprobs=21 is refused: {code}")

code, r = post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 5, "temperature": 1.0},
                             "return_logprob": True, "top_logprobs_num": 3})
ok(code == 200, f"SGLang /generate with top_logprobs_num=3: {code}")
meta = r["meta_info"]
ids = r["output_ids"]
ref = reference(prompt + ids)
good = len(meta["output_top_logprobs"]) == len(ids)
for j, entry in enumerate(meta["output_top_logprobs"]):
    good &= top_ok(ref[len(prompt) + j - 1], [(i, lp) for lp, i, _ in entry], 3)
ok(good, "SGLang output_top_logprobs: the 3 most likely, transformers' logprobs")
print("all checks passed")
