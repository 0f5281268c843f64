"""Reference for tests/optim.rs: torch.optim.AdamW + clip_grad_norm_ on the inputs Rust wrote.

Usage: adamw_ref.py IN.safetensors OUT.safetensors [fused]
IN holds p<i> (initial params), g<s>_<i> (gradient of param i at step s), lr (per step), and
hyper (lr0, beta1, beta2, eps, weight_decay, max_norm). OUT gets p<i> after every step and norm.
"""
import sys

import torch
from safetensors.torch import load_file, save_file

inp = load_file(sys.argv[1])
lr0, beta1, beta2, eps, wd, max_norm = inp["hyper"].tolist()
lrs = inp["lr"].tolist()
n = sum(1 for k in inp if k.startswith("p"))
params = [torch.nn.Parameter(inp[f"p{i}"].clone()) for i in range(n)]
fused = len(sys.argv) > 3 and sys.argv[3] == "fused"
# fused=False is the single-tensor loop (foreach=False); fused=True PyTorch's fused kernel.
opt = torch.optim.AdamW(params, lr=lr0, betas=(beta1, beta2), eps=eps, weight_decay=wd,
                        foreach=False, fused=fused or None)
norms = []
for s, lr in enumerate(lrs):
    for g in opt.param_groups:
        g["lr"] = lr
    for i, p in enumerate(params):
        key = f"g{s}_{i}"
        p.grad = inp[key].clone() if key in inp else None
    norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
    opt.step()
out = {f"p{i}": p.detach().contiguous() for i, p in enumerate(params)}
out["norm"] = torch.tensor(norms, dtype=torch.float64)
save_file(out, sys.argv[2])
