#!/usr/bin/env python3
"""Checks every tensor of a folder written by `temper convert` against the reference `gguf` package.

    .venv/bin/python tools/gguf_check_tensors.py FILE.gguf HF_DIR

Reads FILE.gguf with `gguf.GGUFReader`, dequantizes each tensor with `gguf.quants.dequantize`, maps
llama.cpp names to HF names and, for `llama` files, undoes llama.cpp's Q/K row permutation
(`w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2)`), all written here independently
of the Rust code, then compares with HF_DIR/model.safetensors. Prints one JSON object: n_gguf,
n_ours, missing (HF names not in ours), extra (ours not expected), max_diff, not_bit_equal (names),
dtypes (set of dtypes in ours).
"""

import json
import re
import sys

import numpy as np
import gguf
from safetensors.numpy import load_file

LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def field(r, key):
    return r.fields[key].contents()


def hf_name(name):
    if name in TOP:
        return TOP[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    return f"model.layers.{m[1]}.{LAYER[m[2]]}.{m[3]}"


def main() -> None:
    r = gguf.GGUFReader(sys.argv[1])
    ours = load_file(f"{sys.argv[2]}/model.safetensors")
    arch = field(r, "general.architecture")
    n_head = field(r, f"{arch}.attention.head_count")
    n_kv = field(r, f"{arch}.attention.head_count_kv")
    max_diff, not_equal, expected = 0.0, [], set()
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        kind = t.name.split(".")[-2]
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            heads = n_head if kind == "attn_q" else n_kv
            x = x.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
        name = hf_name(t.name)
        expected.add(name)
        if name not in ours:
            continue
        y = ours[name]
        if y.shape != x.shape:
            not_equal.append(f"{name}: shape {y.shape} vs {x.shape}")
            continue
        max_diff = max(max_diff, float(np.abs(y - x).max()))
        if not np.array_equal(y.view(np.uint32), x.view(np.uint32)):
            not_equal.append(name)
    print(json.dumps({
        "n_gguf": len(r.tensors),
        "n_ours": len(ours),
        "missing": sorted(expected - set(ours)),
        "extra": sorted(set(ours) - expected),
        "max_diff": max_diff,
        "not_bit_equal": not_equal,
        "dtypes": sorted({str(v.dtype) for v in ours.values()}),
    }))


if __name__ == "__main__":
    main()
