#!/usr/bin/env python3
"""Cross-check temper's vectors against verl's own code (not needed by any test).

Runs the cases of a vector folder that verl can compute through verl's `core_algos` (loaded from a
verl wheel or source tree with its heavy imports stubbed out) and prints, per case, the largest
difference between verl's numbers and the case's `expected`. Deviations that temper makes on
purpose (ALGORITHMS.md is the contract) are listed in docs/algorithms.md.

    .venv/bin/python -m pip download verl --no-deps -d /tmp/verl   # once; nothing is installed
    .venv/bin/python tools/algo_verl_crosscheck.py /tmp/verl/verl-*.whl [VECTOR_DIR]
"""

import ast
import json
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def read_source(root, rel):
    root = Path(root)
    if root.suffix == ".whl":
        with zipfile.ZipFile(root) as z:
            return z.read(rel).decode()
    return (root / rel).read_text()


def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class Cfg(dict):
    """Stands in for verl's ActorConfig / AlgoConfig / DictConfig: attributes plus `.get`."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError as e:
            raise AttributeError(k) from e


def load_verl(root):
    # verl.utils.torch_functional: only the pure functions core_algos needs, taken from the source.
    tf_src = read_source(root, "verl/utils/torch_functional.py")
    wanted = {"masked_sum", "masked_mean", "masked_var", "masked_whiten", "entropy_from_logits"}
    tree = ast.parse(tf_src)
    tree.body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    tf = module("verl.utils.torch_functional", torch=torch)
    exec(compile(tree, "torch_functional.py", "exec"), tf.__dict__)
    module("omegaconf", DictConfig=Cfg)
    module("verl")
    module("verl.utils", torch_functional=tf, as_torch_index=None, group_mean_std=None)
    module("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda f: f))
    module("verl.trainer")
    module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (Cfg,), {}))
    module("verl.workers")
    module("verl.workers.config", ActorConfig=Cfg)
    ca = module("verl.trainer.ppo.core_algos")
    exec(compile(read_source(root, "verl/trainer/ppo/core_algos.py"), "core_algos.py", "exec"), ca.__dict__)
    return ca, tf


def t(x):
    return torch.tensor(np.array(x, dtype=np.float64))


def run_case(ca, tf, c):
    op, a, i = c["op"], c["args"], c["inputs"]
    got = {}
    if op == "policy_loss":
        mode = a["loss_mode"]
        if mode not in ca.POLICY_LOSS_REGISTRY:
            return None
        if mode == "vanilla" and a.get("clip_ratio_c", 3.0) is None:
            return None  # verl has no "off" for dual clip
        cfg = Cfg(clip_ratio=a.get("clip_ratio", 0.2), clip_ratio_low=a.get("clip_ratio_low"),
                  clip_ratio_high=a.get("clip_ratio_high"), clip_ratio_c=a.get("clip_ratio_c", 3.0),
                  tau_pos=a.get("tau_pos", 1.0), tau_neg=a.get("tau_neg", 1.05), global_batch_info={},
                  policy_loss=Cfg())
        lp = t(i["log_prob"]).requires_grad_(True)
        w = t(i["rollout_is_weights"]) if "rollout_is_weights" in i else None
        loss, met = ca.get_policy_loss_fn(mode)(t(i["old_log_prob"]), lp, t(i["advantages"]), t(i["response_mask"]),
                                              loss_agg_mode=a.get("loss_agg_mode", "token-mean"), config=cfg,
                                              rollout_is_weights=w)
        loss.backward()
        got = {"pg_loss": loss, "grad_log_prob": lp.grad}
        for k in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
            if f"actor/{k}" in met:
                got[k] = torch.tensor(met[f"actor/{k}"])
    elif op == "agg_loss":
        got["loss"] = ca.agg_loss(t(i["loss_mat"]), t(i["response_mask"]), a["loss_agg_mode"],
                                  loss_scale_factor=a.get("loss_scale_factor"))
    elif op == "kl":
        got["kl"] = ca.kl_penalty(t(i["log_prob"]), t(i["ref_log_prob"]), a["kl_type"])
    elif op == "entropy":
        got["entropy"] = tf.entropy_from_logits(t(i["logits"]))
    elif op == "advantages":
        est = a["estimator"]
        if est == "dr_grpo":
            return None
        r = t(i["rewards"])
        n = r.shape[0]
        mask = t(i["response_mask"]) if "response_mask" in i else torch.ones(n, 1)
        if "index" in i:
            index = np.array([int(x) for x in i["index"]])
        else:
            index = np.arange(n) // a.get("group_size", 1)
        if r.dim() == 1:
            tok = torch.zeros_like(mask)
            if est == "reinforce_plus_plus":
                for k in range(n):
                    L = int(mask[k].sum())
                    if L:
                        tok[k, L - 1] = r[k]
            else:
                tok[:, 0] = r
        else:
            tok = r
        kw = dict(token_level_rewards=tok, response_mask=mask, index=index,
                  config=Cfg(gamma=a.get("gamma", 1.0), norm_adv_by_std_in_grpo=a.get("norm_adv_by_std", True)))
        if est == "grpo":
            kw.update(epsilon=a.get("eps", 1e-6), norm_adv_by_std_in_grpo=a.get("norm_adv_by_std", True))
        adv, _ = ca.get_adv_estimator_fn(est)(**kw)
        want = c["expected"]["advantages"]
        if np.array(want, dtype=np.float64).ndim == 1:
            if est.startswith("reinforce"):
                return None
            # per-response value: the first column carries it only for rows with a valid token
            adv = torch.where(mask.sum(-1) > 0, (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1), torch.nan)
        got["advantages"] = adv
    else:
        return None
    diffs = {}
    for k, v in got.items():
        want = np.array([np.nan if x is None else x for x in np.array(c["expected"][k], dtype=object).ravel()],
                        dtype=np.float64)
        v = v.detach().numpy().astype(np.float64).ravel()
        ok = ~np.isnan(want) & ~np.isnan(v)
        diffs[k] = float(np.max(np.abs(v[ok] - want[ok]) / (1e-9 + np.abs(want[ok])))) if ok.any() else 0.0
    return diffs


def main():
    root = sys.argv[1]
    folder = Path(sys.argv[2] if len(sys.argv) > 2 else "crates/temper-algo/tests/vectors")
    ca, tf = load_verl(root)
    same, differ = 0, 0
    for f in sorted(folder.glob("*.json")):
        c = json.loads(f.read_text())
        try:
            d = run_case(ca, tf, c)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"ERROR {c['name']}: {type(e).__name__}: {e}")
            continue
        if d is None:
            continue
        worst = max(d.values()) if d else 0.0
        if worst > 1e-6:
            differ += 1
            print(f"DIFF  {c['name']}: " + ", ".join(f"{k} rel {v:.2e}" for k, v in d.items() if v > 1e-6))
        else:
            same += 1
    print(f"{same} cases agree with verl, {differ} differ")


if __name__ == "__main__":
    main()
