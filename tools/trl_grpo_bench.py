"""TRL's GRPOTrainer on the CPU or a GPU, timed per step: the reference side of `temper bench grpo`.

Runs GRPO with the same model folder, prompts (chat messages), group size, completion length,
sampling temperature, loss (token-level, TRL's "dapo" = temper's token-mean), learning rate and
no KL term as temper's side, and prints one JSON object:
    {"step_s": [...], "peak_rss_mb": float, "trl": version, "torch": version, "threads": int}

Usage: trl_grpo_bench.py --model DIR --prompts FILE.json --n 8 --max-tokens 12 --steps 3 [--warmup 1]
       [--min-tokens N] [--reward arith|digits|letters] [--micro N] [--gradient-checkpointing] [--bf16]
       [--device cpu|cuda]   (on CUDA, accelerate's GPU; "peak_rss_mb" is then the CUDA allocator's peak)
FILE.json is a list of {"prompt": [{"role", "content"}...], "answer": "7"} in the order used.
TRL version pinned by the project: trl==1.16.0 (scripts/setup-env.sh).
"""
import argparse
import json
import re
import time

import torch
import trl
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--prompts", required=True)
p.add_argument("--n", type=int, default=8)
p.add_argument("--prompts-per-step", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=12)
p.add_argument("--min-tokens", type=int, default=0)
p.add_argument("--reward", choices=["arith", "digits", "letters"], default="arith")
p.add_argument("--micro", type=int, default=0, help="responses per forward/backward (default: all)")
p.add_argument("--gradient-checkpointing", action="store_true")
p.add_argument("--bf16", action="store_true", help="bf16 autocast (transformers' bf16=True; f32 master weights)")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--lr", type=float, default=1e-5)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--out", default="/tmp/trl-grpo-bench")
p.add_argument("--device", default="cpu", help="cpu, or cuda[:N] (TRL on that GPU; peak = CUDA allocator's)")
args = p.parse_args()

rows = json.load(open(args.prompts))
ds = Dataset.from_list(rows)


def last_number(text):
    nums = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return nums[-1] if nums else None


def digits(completions, **_):
    """The fraction of the completion's characters that are ASCII digits (temper's `--reward digits`)."""
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else c
        out.append(sum(ch in "0123456789" for ch in text) / max(len(text), 1))
    return out


def letters(completions, **_):
    """The fraction of the completion's characters that are ASCII letters (temper's `--reward letters`)."""
    out = []
    for c in completions:
        text = c[-1]["content"] if isinstance(c, list) else c
        out.append(sum(("a" <= ch <= "z") or ("A" <= ch <= "Z") for ch in text) / max(len(text), 1))
    return out


def reward(completions, answer, **_):
    out = []
    for c, a in zip(completions, answer):
        text = c[-1]["content"] if isinstance(c, list) else c
        n = last_number(text)
        out.append(1.0 if n is not None and float(n) == float(a) else 0.0)
    return out


def peak_rss_mb():
    """VmHWM of this process (ru_maxrss would include the parent's peak: Linux keeps it across exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


class Timer(TrainerCallback):
    def __init__(self):
        self.times, self.t0 = [], None

    def on_step_begin(self, a, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, a, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)


total = args.steps + args.warmup
responses = args.prompts_per_step * args.n
micro = args.micro or responses
cfg = GRPOConfig(
    output_dir=args.out,
    use_cpu=args.device == "cpu",
    bf16=args.bf16,
    per_device_train_batch_size=micro,
    gradient_accumulation_steps=responses // micro,
    gradient_checkpointing=args.gradient_checkpointing,
    num_generations=args.n,
    max_completion_length=args.max_tokens,
    generation_kwargs={"min_new_tokens": args.min_tokens} if args.min_tokens else None,
    temperature=args.temperature,
    learning_rate=args.lr,
    lr_scheduler_type="constant",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
    beta=0.0,
    loss_type="dapo",
    num_iterations=1,
    max_steps=total,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    shuffle_dataset=False,
    disable_dropout=True,
    seed=0,
)
timer = Timer()
reward_fn = {"digits": digits, "letters": letters, "arith": reward}[args.reward]
trainer = GRPOTrainer(model=args.model, reward_funcs=[reward_fn], args=cfg, train_dataset=ds, callbacks=[timer])
trainer.train()
print(
    json.dumps(
        {
            "step_s": timer.times[args.warmup :],
            "warmup_s": timer.times[: args.warmup],
            "peak_rss_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device != "cpu" else peak_rss_mb(),
            "trl": trl.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
    )
)
