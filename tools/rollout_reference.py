#!/usr/bin/env python3
"""transformers as the independent reference for temper-rollout's tests and benchmark.

Subcommands (JSON on stdin where noted, JSON on stdout):
  make-tiny --out DIR [--seed S]       a tiny random Llama (float32 safetensors + config + generation_config)
  greedy --model DIR                   stdin {"prompts": [[id]], "max_new_tokens": N, "eos": [id],
                                       "repetition_penalty": p}: each prompt alone through
                                       `model.generate(do_sample=False)`; prints
                                       {"completions": [[id]], "logprobs": [[float]]} (raw log-softmax of
                                       the generate scores at the chosen tokens)
  next-probs --model DIR               stdin {"prompt": [id], "temperature", "top_k", "top_p"}: the
                                       next-token distribution after transformers' warpers
  teacher-logprobs --model DIR         stdin {"sequences": [{"prompt": [id], "completion": [id]}],
                                       "temperature": t}: teacher-forced logprob of each completion token
Used live by crates/temper-rollout/tests (via .venv/bin/python).
"""
import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation import logits_process as lp


def make_tiny(out: str, seed: int) -> None:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        # Larger than the usual 0.02 so the logits are spread out (std ~1.5): greedy choices are
        # not near-ties that float rounding could flip, and sampling is far from uniform.
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(out)
    json.dump({"out": out}, sys.stdout)


def load(path: str):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


@torch.no_grad()
def greedy(path: str, req: dict) -> None:
    model = load(path)
    eos = req.get("eos") or None
    completions, logprobs = [], []
    for prompt in req["prompts"]:
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=req["max_new_tokens"],
            eos_token_id=eos,
            pad_token_id=0,
            repetition_penalty=req.get("repetition_penalty", 1.0),
            output_logits=True,
            return_dict_in_generate=True,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        new = out.sequences[0, len(prompt):].tolist()
        lps = [torch.log_softmax(out.logits[i][0].float(), -1)[t].item() for i, t in enumerate(new)]
        completions.append(new)
        logprobs.append(lps)
    json.dump({"completions": completions, "logprobs": logprobs}, sys.stdout)


@torch.no_grad()
def next_probs(path: str, req: dict) -> None:
    model = load(path)
    ids = torch.tensor([req["prompt"]], dtype=torch.long)
    scores = model(ids).logits[:, -1, :].float()
    if req.get("temperature", 1.0) != 1.0:
        scores = lp.TemperatureLogitsWarper(req["temperature"])(ids, scores)
    if req.get("top_k", -1) > 0:
        scores = lp.TopKLogitsWarper(req["top_k"])(ids, scores)
    if req.get("top_p", 1.0) < 1.0:
        scores = lp.TopPLogitsWarper(req["top_p"])(ids, scores)
    json.dump({"probs": torch.softmax(scores, -1)[0].tolist()}, sys.stdout)


@torch.no_grad()
def teacher_logprobs(path: str, req: dict) -> None:
    model = load(path)
    t = req.get("temperature", 1.0)
    out = []
    for s in req["sequences"]:
        p, c = s["prompt"], s["completion"]
        ids = torch.tensor([p + c], dtype=torch.long)
        logits = model(ids).logits[0].float() / t
        lps = torch.log_softmax(logits, -1)
        out.append([lps[len(p) - 1 + i, tok].item() for i, tok in enumerate(c)])
    json.dump({"logprobs": out}, sys.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["make-tiny", "greedy", "next-probs", "teacher-logprobs"])
    ap.add_argument("--out")
    ap.add_argument("--model")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "make-tiny":
        make_tiny(a.out, a.seed)
        return
    req = json.load(sys.stdin)
    {"greedy": greedy, "next-probs": next_probs, "teacher-logprobs": teacher_logprobs}[a.cmd](a.model, req)


if __name__ == "__main__":
    main()
