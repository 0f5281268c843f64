"""GRPO written only against the tinker SDK, run on `temper serve` (a local Tinker).

    ./temper serve --model smollm2 &                 # also serves Tinker's /api/v1
    TINKER_BASE_URL=http://127.0.0.1:30000 TINKER_API_KEY=tml-local TINKER_TELEMETRY=0 \
        .venv/bin/python examples/tinker_rl_loop.py --steps 15

Task: 1-digit additions ("What is 3+5?") in SmolLM2's chat template, without a system prompt, so
the model starts out verbose and often runs past `--max-tokens` before it states the sum. Reward 1
when the last number of the completion is the sum. Each step: snapshot the weights for sampling,
sample a group per prompt, centre the rewards per group (GRPO without std), and train the sampled
tokens with Tinker's `importance_sampling` loss (a sum over tokens; the advantage is divided by the
completion's length, so long and short answers weigh alike), then `optim_step`. The reward rises
within a few minutes on a 2-core CPU. Prints one JSON line per step.
"""
import argparse
import json
import random
import re
import time

import tinker
from tinker import types

p = argparse.ArgumentParser()
p.add_argument("--base-model", default="smollm2")
p.add_argument("--steps", type=int, default=15)
p.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
p.add_argument("--group-size", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=16)
p.add_argument("--lr", type=float, default=4e-4)
p.add_argument("--rank", type=int, default=16)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--keep-all", action="store_true",
               help="train on every sample, also those whose group agrees (advantage 0): the work "
                    "`temper bench tinker` compares with the in-process trainer")
args = p.parse_args()

rng = random.Random(args.seed)
sc = tinker.ServiceClient()
tc = sc.create_lora_training_client(base_model=args.base_model, rank=args.rank, seed=args.seed).result()
tok = tc.get_tokenizer()
stop = [tok.eos_token_id]


def problem():
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    text = tok.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}?"}],
                                   tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False), a + b


def reward(tokens, answer):
    numbers = re.findall(r"-?\d+", tok.decode(tokens, skip_special_tokens=True))
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


for step in range(1, args.steps + 1):
    t0 = time.time()
    sampler = tc.save_weights_and_get_sampling_client().result()
    problems = [problem() for _ in range(args.prompts)]
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop=stop,
                                  seed=rng.randrange(2**31))
    futures = [sampler.sample(types.ModelInput.from_ints(prompt), num_samples=args.group_size,
                              sampling_params=params) for prompt, _ in problems]
    t_sample = time.time()
    data, rewards = [], []
    for (prompt, answer), fut in zip(problems, futures):
        seqs = fut.result().sequences
        rs = [reward(s.tokens, answer) for s in seqs]
        rewards += rs
        mean = sum(rs) / len(rs)
        for s, r in zip(seqs, rs):
            if r == mean and not args.keep_all:  # no signal from this sample (its group agrees)
                continue
            full = prompt + s.tokens
            pad = [0.0] * (len(prompt) - 1)
            adv = (r - mean) / len(s.tokens)
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={"target_tokens": full[1:], "logprobs": pad + list(s.logprobs),
                                "advantages": pad + [adv] * len(s.tokens)}))
    t_train = time.time()
    if data:
        fb = tc.forward_backward(data, "importance_sampling")
        opt = tc.optim_step(types.AdamParams(learning_rate=args.lr))
        fb.result()
        opt.result()
    t_end = time.time()
    print(json.dumps({"step": step, "reward": round(sum(rewards) / len(rewards), 4), "datums": len(data),
                      "s_sample": round(t_train - t0, 2), "s_train": round(t_end - t_train, 2),
                      "s_step": round(t_end - t0, 2)}), flush=True)
