#!/usr/bin/env python3
"""transformers as the independent reference for temper-rollout's tests.

  fixtures --out DIR
      DIR/tiny/                 a tiny random Llama (f32 safetensors, config, generation_config)
      DIR/reference.json        everything the tests compare against (see `build_reference`)
  greedy --model DIR --out FILE.json
      stdin-free: greedy `generate` of the fixed SmolLM2 chat prompts below, for the real-model test

The Rust tests run this once and cache DIR under target/tmp, keyed by a hash of this file.
Usage: .venv/bin/python tools/rollout_reference.py fixtures --out DIR
"""
import argparse
import json
import math
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation import logits_process as lp

VOCAB = 96


def make_tiny(out: str, seed: int = 0) -> None:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
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


def prompts() -> list:
    """Mixed lengths (1 to 17 tokens), ids in 3..96."""
    return [[3 + (i * 31 + j * 17 + 7) % 93 for j in range(n)] for i, n in enumerate([1, 4, 9, 2, 17, 6])]


@torch.no_grad()
def greedy(model, prompt, max_new, eos, repetition_penalty=1.0, min_new_tokens=0):
    """transformers' greedy generate for one unpadded prompt: (new ids, raw logprob of each)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    model.generation_config.eos_token_id = eos or None
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos or None,
        pad_token_id=0,
        repetition_penalty=repetition_penalty,
        min_new_tokens=min_new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    new = out.sequences[0, len(prompt):].tolist()
    lps = [torch.log_softmax(out.logits[i][0].float(), -1)[t].item() for i, t in enumerate(new)]
    return new, lps


@torch.no_grad()
def next_probs(model, prompt, temperature, top_k, top_p):
    """Next-token distribution after transformers' temperature/top-k/top-p warpers."""
    ids = torch.tensor([prompt], dtype=torch.long)
    scores = model(ids).logits[:, -1, :].float()
    if temperature != 1.0:
        scores = lp.TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k > 0:
        scores = lp.TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = lp.TopPLogitsWarper(top_p)(ids, scores)
    return torch.softmax(scores, -1)[0].tolist()


def processors_case():
    """Random logits and per-row settings, processed by transformers' processors row by row, in
    generate's order: repetition penalty, min-new-tokens EOS ban, temperature, top-k, top-p."""
    g = torch.Generator().manual_seed(5)
    vocab = 64
    settings = [  # temperature, top_k, top_p, repetition_penalty, #seen, #banned
        (1.0, -1, 1.0, 1.0, 0, 0),
        (0.7, -1, 1.0, 1.0, 0, 0),
        (1.0, 5, 1.0, 1.0, 0, 0),
        (1.0, -1, 0.8, 1.0, 0, 0),
        (1.3, 10, 0.5, 1.0, 0, 0),
        (0.6, -1, 0.95, 1.2, 12, 0),
        (1.0, -1, 1.0, 0.8, 7, 0),
        (0.9, 3, 0.9, 1.5, 5, 2),
        (1.0, 1, 1.0, 1.0, 0, 1),
        (2.0, vocab + 5, 0.3, 1.1, 30, 3),
        (0.0, -1, 1.0, 1.3, 4, 1),
    ]
    logits = torch.rand((len(settings), vocab), generator=g) * 8 - 4
    rows, out = [], []
    for i, (t, k, p, pen, n_seen, n_banned) in enumerate(settings):
        seen = torch.randint(0, vocab, (n_seen,), generator=g).tolist()
        banned = torch.randint(0, vocab, (n_banned,), generator=g).tolist()
        rows.append({"temperature": t, "top_k": k, "top_p": p, "repetition_penalty": pen, "seen": seen, "banned": banned})
        s = logits[i : i + 1].clone()
        if pen != 1.0 and seen:
            s = lp.RepetitionPenaltyLogitsProcessor(pen)(torch.tensor([seen]), s)
        if banned:  # zero new tokens so far, one required: every "EOS" id is banned
            s = lp.MinNewTokensLengthLogitsProcessor(1, 1, banned)(torch.zeros((1, 1), dtype=torch.long), s)
        if t not in (0.0, 1.0):
            s = lp.TemperatureLogitsWarper(t)(None, s)
        if k > 0:
            s = lp.TopKLogitsWarper(k)(None, s)
        if p < 1.0:
            s = lp.TopPLogitsWarper(p)(None, s)
        out.append([None if math.isinf(v) else v for v in s[0].tolist()])
    return {"logits": logits.tolist(), "rows": rows, "processed": out}


def build_reference(model_dir: str) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ps = prompts()
    ref = {"prompts": ps}
    # Greedy with no EOS: the base sequences; EOS ids are then picked from them so they occur.
    ref["free16"] = [greedy(model, p, 16, [])[0] for p in ps]
    eos = ref["free16"][1][4]
    out = [greedy(model, p, 12, [eos]) for p in ps]
    ref["greedy_eos"] = {"eos": eos, "max_new": 12, "completions": [c for c, _ in out], "logprobs": [l for _, l in out]}
    eos = ref["free16"][0][1]
    ref["greedy_penalty_min"] = {
        "eos": eos, "max_new": 10, "repetition_penalty": 1.4, "min_new_tokens": 5,
        "completions": [greedy(model, p, 10, [eos], 1.4, 5)[0] for p in ps],
        "without_penalty": [greedy(model, p, 10, [eos], 1.0, 5)[0] for p in ps],
    }
    ref["next_probs"] = [
        {"prompt_index": 2, "temperature": t, "top_k": k, "top_p": p, "probs": next_probs(model, ps[2], t, k, p)}
        for t, k, p in [(0.8, -1, 1.0), (1.3, 6, 0.7), (1.3, -1, 1.0)]
    ]
    ref["processors"] = processors_case()
    return ref


SMOLLM2_QUESTIONS = ["What is 7 * 8?", "Name a primary color.", "Write a haiku about the sea."]


@torch.no_grad()
def smollm2_greedy(model_dir: str, out: str) -> None:
    """Greedy 16 tokens for each chat prompt alone, with the model's EOS; ids via its chat template."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    rows = []
    for q in SMOLLM2_QUESTIONS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        new, lps = greedy(model, prompt, 16, eos)
        rows.append({"question": q, "prompt": prompt, "completion": new, "logprobs": lps})
    with open(out, "w") as f:
        json.dump({"eos": eos, "rows": rows}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["fixtures", "greedy"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "fixtures":
        os.makedirs(a.out, exist_ok=True)
        tiny = os.path.join(a.out, "tiny")
        make_tiny(tiny)
        with open(os.path.join(a.out, "reference.json"), "w") as f:
            json.dump(build_reference(tiny), f)
    else:
        smollm2_greedy(a.model, a.out)


if __name__ == "__main__":
    main()
