"""verl's LR lambdas (verl/utils/torch_functional.py, with verl's warmup resolution from its
FSDP workers), evaluated for tests/optim.rs.

Usage: lr_ref.py OUT.json CASE... with CASE = kind:warmup_steps:warmup_ratio:min_lr_ratio:total
(lr = 2.0). OUT gets one list of lrs per case, for steps 0..total+2.
"""
import json
import math
import sys



def lrs(case):
    kind, warm, ratio, min_lr_ratio, total = case.split(":")
    warm, ratio, min_lr_ratio, total = int(warm), float(ratio), float(min_lr_ratio), int(total)
    num_warmup_steps = warm if warm >= 0 else int(ratio * total)

    def constant(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1.0, num_warmup_steps))
        return 1.0

    def cosine(current_step, num_cycles=0.5, init_lr_ratio=0.0):
        coef = (1 - min_lr_ratio) * 0.5
        intercept = (1 + min_lr_ratio) * 0.5
        if current_step < num_warmup_steps:
            return init_lr_ratio + (1.0 - init_lr_ratio) * (float(current_step) / float(max(1, num_warmup_steps)))
        progress = float(current_step - num_warmup_steps) / float(max(1, total - num_warmup_steps))
        x = math.cos(math.pi * float(num_cycles) * 2.0 * progress)
        return max(min_lr_ratio, x * coef + intercept)

    f = constant if kind == "constant" else cosine
    return [2.0 * f(k) for k in range(total + 2)]


json.dump([lrs(c) for c in sys.argv[2:]], open(sys.argv[1], "w"))
