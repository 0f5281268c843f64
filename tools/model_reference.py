#!/usr/bin/env python3
"""Reference numbers for temper-model's tests, computed with transformers (an independent
implementation of the same decoders).

Writes, under --out:
  <name>/                 a tiny random-weight HF checkpoint (config.json + model.safetensors)
  <name>/reference.json   {"rows": [[ids...], ...], "coef": [[...], ...],
                           "logp": [[...]], "entropy": [[...]],            (temperature 1, per row, unpadded)
                           "logp_t": [[...]], "entropy_t": [[...]],        (temperature TEMP)
                           "temperature": TEMP, "loss": float, "grad_names": [...],
                           "autocast_bf16_mean_err"/"autocast_bf16_max_err": |logp| error of
                           torch.autocast(bf16) vs f32, a yardstick for temper's bf16 path}
  <name>/grads.safetensors  d loss / d param for grad_names, where
      loss = sum_rows sum_t coef[r][t] * logp_t[r][t] + 0.1 * entropy_t[r][t]
Row r's logp[t] is log p(ids[t+1] | ids[..=t]) for t in 0..len-1 (len-1 numbers).

Usage: .venv/bin/python tools/model_reference.py --out DIR [--models llama,qwen2,qwen3]
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

TEMP = 0.7
VOCAB = 97

CONFIGS = {
    # Llama: tied head, GQA 4/2, llama3 rope scaling, small theta so rotations matter at short lengths.
    "llama": lambda: LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=True,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        bos_token_id=1, eos_token_id=2, pad_token_id=0),
    # Qwen2: untied head, q/k/v bias, GQA 4/1.
    "qwen2": lambda: Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        bos_token_id=1, eos_token_id=[2, 3]),
    # Qwen3: q/k RMSNorm, head_dim (24) != hidden / heads (16), untied.
    "qwen3": lambda: Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=1, eos_token_id=2),
}

# Parameters whose gradients are compared (per model; present in all three unless noted).
GRAD_NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.1.self_attn.o_proj.weight",
    "model.layers.1.mlp.gate_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.input_layernorm.weight",
    "model.norm.weight",
]
EXTRA_GRADS = {
    "qwen2": ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias", "lm_head.weight"],
    "qwen3": ["model.layers.2.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight", "lm_head.weight"],
    "llama": [],
}


def randomize(model, gen):
    """Weights large enough that next-token distributions are far from uniform."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / math.sqrt(p.shape[1])))


def row_numbers(model, ids, temperature):
    logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    targets = torch.tensor(ids[1:])
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def make(name, out, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = CONFIGS[name]()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    randomize(model, gen)
    model.eval()
    d = os.path.join(out, name)
    model.save_pretrained(d)
    lengths = [9, 3, 14, 6]
    rows = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]
    coef = [torch.randn(n - 1, generator=gen).tolist() for n in lengths]
    ref = {"rows": rows, "coef": coef, "temperature": TEMP, "logp": [], "entropy": [], "logp_t": [], "entropy_t": []}
    with torch.no_grad():
        for ids in rows:
            lp, en = row_numbers(model, ids, 1.0)
            ref["logp"].append(lp.tolist())
            ref["entropy"].append(en.tolist())
    # bf16 yardstick: how far PyTorch's own CPU autocast (bf16 matmuls, f32 weights) lands from f32.
    errs = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for ids, ref_lp in zip(rows, ref["logp"]):
            lp, _ = row_numbers(model, ids, 1.0)
            errs += (lp.float() - torch.tensor(ref_lp)).abs().tolist()
    ref["autocast_bf16_mean_err"] = sum(errs) / len(errs)
    ref["autocast_bf16_max_err"] = max(errs)
    loss = 0.0
    for ids, c in zip(rows, coef):
        lp, en = row_numbers(model, ids, TEMP)
        ref["logp_t"].append(lp.tolist())
        ref["entropy_t"].append(en.tolist())
        loss = loss + (torch.tensor(c) * lp).sum() + 0.1 * en.sum()
    loss.backward()
    params = dict(model.named_parameters())
    names = GRAD_NAMES + EXTRA_GRADS[name]
    if cfg.tie_word_embeddings:
        names = [n for n in names if n != "lm_head.weight"]
    save_file({n: params[n].grad.contiguous() for n in names}, os.path.join(d, "grads.safetensors"))
    ref["loss"] = float(loss.detach())
    ref["grad_names"] = names
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama,qwen2,qwen3")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, name in enumerate(args.models.split(",")):
        make(name, args.out, args.seed + i)


if __name__ == "__main__":
    main()
