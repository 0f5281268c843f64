#!/usr/bin/env python3
"""Recompute, from an environment run's logged files alone, every advantage and the loss temper
trained with, and compare (an independent check of temper-env and the trainer).

Reads <run>/config.toml (env.debate_train, env.grpo_std, env.r23_constant, algorithm.norm_adv_by_std_in_grpo),
<run>/debate_<k>.json or <run>/summary_<k>.json / baseline_<k>.json, and
<run>/training_step_<s>.json. For debates, each datum is matched to its debater by tokens and its
advantages are recomputed from the verdicts and R1 task rewards; for one-turn tasks, GRPO's
(r - mean) / (std + 1e-6) (unbiased std, as verl) over each question's answers. With
`--loss importance_sampling` and a first update at ratio 1 (trainer.check_on_policy), the logged
loss must be -sum over datums and tokens of mask * advantage.

Usage: python tools/check_env_logs.py RUN_DIR [--loss importance_sampling]
Prints one line per step; exits 1 on the first mismatch.
"""
import argparse
import glob
import json
import math
import os
import sys
import tomllib
from collections import defaultdict

TOL = 1e-6


def load(path):
    with open(path) as f:
        return json.load(f)


def fail(msg):
    print(f"MISMATCH: {msg}")
    sys.exit(1)


def centred(xs, use_std):
    if not xs:
        return []
    m = sum(xs) / len(xs)
    if not use_std:
        return [x - m for x in xs]
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    return [0.0 if sd == 0 else (x - m) / sd for x in xs]


def debate_expected(debates, mode, grpo_std, c):
    """{(prompt tuple, completion tuple): (advantages, mask)} for the datums of one step."""
    out = {}
    by_group = defaultdict(list)
    for d in debates:
        if d["verdict"] in ("A", "B"):
            by_group[d["group"]].append(d)
    for group, ds in by_group.items():
        agents = []  # (debate, agent index, won)
        for d in ds:
            w = 0 if d["verdict"] == "A" else 1
            agents.append((d, w, True))
            if mode == "r1_r23":
                agents.append((d, 1 - w, False))
        rewards = [d["agents"][a]["r1_task_reward"] for d, a, _ in agents]
        if mode == "rs_grpo":
            adv = centred(rewards, grpo_std)
        elif mode == "r1_r23":
            adv = centred(rewards, True)
        else:
            adv = [None] * len(agents)
        for (d, a, won), base in zip(agents, adv):
            rounds = d["agents"][a]["rounds"]
            prompt = rounds[0]["prompt_tokens"]
            full = rounds[-1]["prompt_tokens"] + rounds[-1]["completion_tokens"]
            completion = full[len(prompt):]
            mask = [0] * len(completion)
            r1 = set()
            for k, r in enumerate(rounds):
                start = len(r["prompt_tokens"]) - len(prompt)
                for i in range(start, start + len(r["completion_tokens"])):
                    mask[i] = 1
                    if k == 0:
                        r1.add(i)
            t = sum(mask)
            if mode == "rejection":
                per = [1.0 / t if m else 0.0 for m in mask]
            elif mode == "rs_grpo":
                per = [base / t if m else 0.0 for m in mask]
            else:
                per = [0.0 if not m else (base if i in r1 else (c if won else -c)) for i, m in enumerate(mask)]
            out[(tuple(prompt), tuple(completion))] = (per, mask)
    return out


def single_expected(records, datums):
    """GRPO advantages per datum from the logged rewards (grouped by question, in order)."""
    by_group = defaultdict(list)
    for r in records:
        by_group[r["group"]].append(r["reward"])
    adv = {}
    for g, rs in by_group.items():
        n = len(rs)
        m = sum(rs) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in rs) / (n - 1)) if n > 1 else 0.0
        adv[g] = [(x - m) / (sd + 1e-6) for x in rs]
    seen = defaultdict(int)
    out = []
    for d in datums:
        k = seen[d["group"]]
        seen[d["group"]] += 1
        a = adv[d["group"]][k]
        out.append([a if m else 0.0 for m in d["completion_mask"]])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--loss", default=None)
    a = ap.parse_args()
    with open(os.path.join(a.run, "config.toml"), "rb") as f:
        cfg = tomllib.load(f)
    env = cfg["env"]
    steps = sorted(glob.glob(os.path.join(a.run, "training_step_*.json")),
                   key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    if not steps:
        fail("no training_step_<k>.json")
    for path in steps:
        st = load(path)
        s = st["step"]
        datums = st["datums"]
        if env["name"] == "debate":
            debates = [d for d in map(load, glob.glob(os.path.join(a.run, "debate_*.json"))) if d["step"] == s]
            exp = debate_expected(debates, env["debate_train"], env["grpo_std"], env["r23_constant"])
            if len(exp) != len(datums):
                fail(f"step {s}: {len(datums)} datums, expected {len(exp)}")
            want = []
            for d in datums:
                key = (tuple(d["prompt_tokens"]), tuple(d["completion_tokens"]))
                if key not in exp:
                    fail(f"step {s}: a datum matches no debater's transcript")
                per, mask = exp[key]
                if d["completion_mask"] != mask:
                    fail(f"step {s}: completion_mask differs from the debater's sampled spans")
                want.append(per)
        else:
            kind = "summary" if env["name"] == "summary" else "baseline"
            # In file order: within a question, the sample order of the datums.
            ordered = sorted(
                ((int(p.rsplit("_", 1)[1].split(".")[0]), load(p))
                 for p in glob.glob(os.path.join(a.run, f"{kind}_*.json"))),
                key=lambda x: x[0])
            recs = [r for _, r in ordered if r["step"] == s]
            want = single_expected(recs, datums)
        total = 0.0
        for i, (d, w) in enumerate(zip(datums, want)):
            n = len(d["completion_tokens"])
            if not (n and len(d["completion_logprobs"]) == n and len(d["completion_advantages"]) == n
                    and len(d["completion_mask"]) == n):
                fail(f"step {s} datum {i}: lengths differ or are 0")
            for j, (got, exp) in enumerate(zip(d["completion_advantages"], w)):
                if abs(got - exp) > TOL * max(1.0, abs(exp)):
                    fail(f"step {s} datum {i} token {j}: advantage {got} != {exp}")
            total += sum(x for x, m in zip(w, d["completion_mask"]) if m)
        trained = sum(sum(d["completion_mask"]) for d in datums)
        if st["num_trained_tokens"] == 0 and all(x == 0 for w in want for x in w):
            print(f"step {s}: every advantage is 0, the update was skipped; advantages match")
            continue
        if st["num_trained_tokens"] != trained:
            fail(f"step {s}: num_trained_tokens {st['num_trained_tokens']} != {trained}")
        line = f"step {s}: {len(datums)} datums, {trained} trained tokens, advantages match"
        if a.loss == "importance_sampling" and trained:
            if abs(st["loss"] - (-total)) > 1e-4 * max(1.0, abs(total)):
                fail(f"step {s}: loss {st['loss']} != -sum(A) = {-total}")
            line += f", loss {st['loss']:.6g} == -sum(A)"
        print(line)


if __name__ == "__main__":
    main()
