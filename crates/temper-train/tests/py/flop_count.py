"""Reference for tests/roof.rs: the matmul FLOPs PyTorch's own counter (FlopCounterMode) sees in one
forward and backward of a transformers Qwen2 model, the head over every position.

Usage: flop_count.py CONFIG.json TOKENS OUT.json
CONFIG holds vocab, hidden, intermediate, layers, heads, kv_heads. OUT gets {"matmul_flops": N}, the
sum over aten.mm and aten.addmm (the projections and the head; attention's own products, bmm and
SDPA, are left out as the model FLOP convention leaves them out).
"""
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

c = json.load(open(sys.argv[1]))
tokens = int(sys.argv[2])
cfg = Qwen2Config(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                  num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                  num_key_value_heads=c["kv_heads"], tie_word_embeddings=True)
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).float()
ids = torch.randint(0, c["vocab"], (1, tokens))
counter = FlopCounterMode(display=False)
with counter:
    model(input_ids=ids).logits.sum().backward()
ops = counter.get_flop_counts()["Global"]
mm = sum(v for k, v in ops.items() if str(k).split(".")[1] in ("mm", "addmm"))
json.dump({"matmul_flops": mm, "ops": {str(k): v for k, v in ops.items()}}, open(sys.argv[3], "w"))
