"""Reference for tests/roof.rs: what decoding reads and computes, from transformers' own model and
cache rather than from temper's formulas.

Usage: decode_work.py CONFIG.json ROWS PROMPT NEW OUT.json
CONFIG holds vocab, hidden, intermediate, layers, heads, kv_heads. One prefill of ROWS prompts of
PROMPT tokens, then NEW - 1 decode steps of one token per row (eager attention, DynamicCache).
OUT gets, over the decode steps only:
  weight_bytes: per step, the bytes of every nn.Linear weight the step multiplies by (the
    projections and the head; the tied head is the embedding matrix), f32;
  kv_bytes: the bytes of the keys and values the steps attend to (the cache after each step's
    update, summed over steps);
  flops: PyTorch's FlopCounterMode over the decode forwards (mm/addmm/bmm: the matmuls and the
    attention's two products).
"""
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

c = json.load(open(sys.argv[1]))
rows, prompt, new = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = Qwen2Config(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                  num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                  num_key_value_heads=c["kv_heads"], tie_word_embeddings=True,
                  attn_implementation="eager")
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).float().eval()
linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linear)


def cache_bytes(cache):
    total = 0
    for layer in cache.layers:
        total += layer.keys.numel() * layer.keys.element_size()
        total += layer.values.numel() * layer.values.element_size()
    return total


ids = torch.randint(0, c["vocab"], (rows, prompt))
cache = DynamicCache()
flops, kv_bytes = 0, 0
with torch.no_grad():
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new - 1):
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
        ops = counter.get_flop_counts()["Global"]
        flops += sum(v for k, v in ops.items() if str(k).split(".")[1] in ("mm", "addmm", "bmm"))
        kv_bytes += cache_bytes(cache)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
json.dump({"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops}, open(sys.argv[5], "w"))
