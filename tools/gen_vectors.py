#!/usr/bin/env python3
"""Generate temper-algo's test vectors (VECTORS.md format) from the formulas of ALGORITHMS.md.

An independent reference: plain PyTorch in float64, written from the formulas (and verl's code
conventions where the formulas leave a choice), not from temper's Rust code. Run from the repo root:

    .venv/bin/python tools/gen_vectors.py [OUT_DIR]

OUT_DIR defaults to crates/temper-algo/tests/vectors; existing *.json files there are replaced.
"""

import json
import math
import sys
from pathlib import Path

import torch

torch.set_default_dtype(torch.float64)
RTOL, ATOL = 1e-7, 1e-9
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("crates/temper-algo/tests/vectors")
CASES = []


# ---------------------------------------------------------------- output helpers


def to_json(x):
    """Tensor / number -> nested lists; NaN -> None (VECTORS.md: null means NaN expected)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().tolist()
    if isinstance(x, list):
        return [to_json(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def case(name, op, args, inputs, expected, note=None, rtol=RTOL, atol=ATOL):
    c = {"name": name, "op": op, "args": args,
         "inputs": {k: to_json(v) for k, v in inputs.items()},
         "expected": {k: to_json(v) for k, v in expected.items()},
         "rtol": rtol, "atol": atol}
    if note:
        c["note"] = note
    CASES.append(c)


def rounded(t, nd=4):
    """Short inputs: the JSON holds exactly these floats, so the results are computed from them."""
    return torch.round(t * 10**nd) / 10**nd


# ---------------------------------------------------------------- the formulas


def masked_mean(x, m, dim=None):
    if dim is None:
        return (x * m).sum() / m.sum()
    return (x * m).sum(dim) / m.sum(dim)


def metric_mean(x, m, dim=None):
    """verl's masked_mean for metrics: sum / (count + 1e-8)."""
    if dim is None:
        return (x * m).sum() / (m.sum() + 1e-8)
    return (x * m).sum(dim) / (m.sum(dim) + 1e-8)


def masked_whiten(x, m):
    n = m.sum()
    mean = (x * m).sum() / n
    var = ((x - mean) ** 2 * m).sum() / n * n / (n - 1)
    return (x - mean) / torch.sqrt(var + 1e-8)


def agg(L, M, mode, S=None):
    """ALGORITHMS.md section 3 on one mini-batch. The seq-mean modes average over rows with >= 1 valid token."""
    row_sum = (L * M).sum(-1)
    count = M.sum(-1)
    rows = (count > 0).sum()
    if mode == "token-mean":
        return row_sum.sum() / count.sum()
    if mode == "token-sum":
        return row_sum.sum()
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / rows
    if mode == "seq-mean-token-sum-norm":
        return row_sum.sum() / rows / (S if S is not None else L.shape[-1])
    if mode == "seq-mean-token-mean":
        nonempty = count > 0
        return (row_sum[nonempty] / count[nonempty]).sum() / nonempty.sum()
    raise ValueError(mode)


AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum"]


def groups(index):
    out = {}
    for i, g in enumerate(index):
        out.setdefault(g, []).append(i)
    return list(out.values())


def advantages_ref(est, scores, mask, index, norm_by_std=True, eps=1e-6):
    """Per-response scalar advantages of the group estimators (section 1)."""
    s = scores.tolist()
    lens = mask.sum(-1).tolist()
    adv = list(s)
    for g in groups(index):
        vals = [s[i] for i in g]
        n = len(vals)
        mean = sum(vals) / n
        if est in ("grpo", "dr_grpo"):
            if n == 1:
                m, sd = 0.0, 1.0
            else:
                m = mean
                sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
            for i in g:
                adv[i] = (s[i] - m) / (sd + eps) if (norm_by_std and est == "grpo") else s[i] - m
        elif est == "rloo":
            for i in g:
                # mean of the others; a group of one keeps its raw score (verl)
                adv[i] = s[i] - sum(s[j] for j in g if j != i) / (n - 1) if n > 1 else s[i]
        elif est == "reinforce_plus_plus_baseline":
            for i in g:
                adv[i] = s[i] - (mean if n > 1 else 0.0)
        elif est == "opo":
            b = sum(lens[i] * s[i] for i in g) / sum(lens[i] for i in g) if n > 1 else 0.0
            for i in g:
                adv[i] = s[i] - b
    return torch.tensor(adv)


def ratio_terms(logp, old):
    d = torch.clamp(logp - old, -20, 20)
    return d, torch.exp(d)


def policy_loss_ref(mode, logp, old, A, M, agg_mode, lo=0.2, hi=0.2, c=3.0, tau_pos=1.0, tau_neg=1.05,
                    cap=None, w=None):
    """Section 2. Returns pg_losses, pg_loss, metrics dict."""
    met = {}
    if mode in ("vanilla", "grpo_clip", "tinker_ppo"):
        d, r = ratio_terms(logp, old)
        met["ppo_kl"] = metric_mean(-d, M)
        unclipped = r * A
        clipped = torch.clamp(r, 1 - lo, 1 + hi) * A
        L = -torch.min(unclipped, clipped)
        met["pg_clipfrac"] = metric_mean((clipped < unclipped).double(), M)
        met["pg_clipfrac_lower"] = torch.tensor(0.0)
        if mode == "vanilla" and c is not None:
            neg = (A < 0).expand_as(L)
            cap_loss = -c * A
            met["pg_clipfrac_lower"] = metric_mean(((L > cap_loss) & neg).double(), M)
            L = torch.where(neg, torch.min(L, cap_loss), L)
    elif mode in ("no_baseline", "reinforce_with_baseline", "gpg"):
        L = -A * logp
    elif mode in ("cispo", "trl_cispo", "tinker_cispo"):
        d, r = ratio_terms(logp, old)
        met["ppo_kl"] = metric_mean(-d, M)
        if mode == "trl_cispo":
            rc = torch.clamp(r, max=5.0 if cap is None else cap)
        else:
            # cispo and Tinker's cispo: clamp(r, clip_low_threshold, clip_high_threshold), the
            # thresholds being 1 - lo and 1 + hi (Tinker's defaults 0.8 / 1.2).
            rc = torch.clamp(r, 1 - lo, 1 + hi)
        met["pg_clipfrac"] = metric_mean((rc != r).double(), M)
        met["pg_clipfrac_lower"] = torch.tensor(0.0)
        L = -rc.detach() * A * logp
    elif mode == "tinker_importance_sampling":
        d, r = ratio_terms(logp, old)
        met["ppo_kl"] = metric_mean(-d, M)
        L = -r * A
    elif mode == "gspo":
        D = logp - old
        met["ppo_kl"] = metric_mean(-D, M)
        log_si = (D * M).sum(-1) / M.sum(-1).clamp(min=1)
        s = torch.exp(torch.clamp(logp - logp.detach() + log_si.detach()[:, None], max=10.0))
        a, b = -A * s, -A * torch.clamp(s, 1 - lo, 1 + hi)
        L = torch.max(a, b)
        met["pg_clipfrac"] = metric_mean((b > a).double(), M)
        met["pg_clipfrac_lower"] = torch.tensor(0.0)
    elif mode == "sapo":
        d, r = ratio_terms(logp, old)
        met["ppo_kl"] = metric_mean(-d, M)
        tau = torch.where(A > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
        L = -A * (4.0 / tau) * torch.sigmoid(tau * (r - 1))
        met["pg_clipfrac"] = torch.tensor(0.0)
        met["pg_clipfrac_lower"] = torch.tensor(0.0)
    elif mode == "geo_mean":
        D = logp - old
        met["ppo_kl"] = metric_mean(-D, M)
        sg = torch.sign(A)
        Dc = torch.clamp(D, -lo, hi)
        Dmin = sg * torch.min(sg * D, sg * Dc)
        n = M.sum(-1)
        rho = torch.exp((Dmin * M).sum(-1) / (n + 1e-8))
        a_seq = (A * M).sum(-1) / (n + 1e-8)
        per_seq = -a_seq * rho
        if w is not None:
            per_seq = per_seq * torch.exp((torch.log(w + 1e-10) * M).sum(-1) / (n + 1e-8))
        clipped = (D != Dc)
        met["pg_clipfrac"] = metric_mean((clipped & (A > 0)).double(), M)
        met["pg_clipfrac_lower"] = metric_mean((clipped & (A < 0)).double(), M)
        return per_seq, per_seq.mean(), met
    else:
        raise ValueError(mode)
    if w is not None:
        L = L * w
    forced = {"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "tinker_importance_sampling": "token-sum",
              "tinker_ppo": "token-sum", "tinker_cispo": "token-sum"}.get(mode, agg_mode)
    return L, agg(L, M, forced), met


def kl_ref(logp, ref, kl_type):
    st = kl_type.endswith("+")
    base = kl_type.rstrip("+")
    x = logp - ref
    if base in ("k1", "kl"):
        v = x
    elif base == "abs":
        v = x.abs()
    elif base in ("k2", "mse"):
        return 0.5 * x * x
    elif base in ("k3", "low_var_kl"):
        u = torch.clamp(ref - logp, -20, 20)
        v = torch.clamp(torch.exp(u) - u - 1, -10, 10)
    else:
        raise ValueError(kl_type)
    if st:
        k2 = 0.5 * x * x
        return k2 + (v - k2).detach()
    return v


def entropy_ref(logits):
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


# ---------------------------------------------------------------- inputs

g = torch.Generator().manual_seed(20261117)


def randn(*shape):
    return torch.randn(*shape, generator=g)


def rand(*shape):
    return torch.rand(*shape, generator=g)


# Ragged mask: full row, 4 valid, 1 valid, none, 3 valid.
MASK = torch.tensor([[1, 1, 1, 1, 1, 1],
                     [1, 1, 1, 1, 0, 0],
                     [1, 0, 0, 0, 0, 0],
                     [0, 0, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0]], dtype=torch.float64)
B, T = MASK.shape
LOGP = rounded(-0.05 - 2.5 * rand(B, T))
OLD = rounded(LOGP + 0.3 * randn(B, T))
ADV_SEQ = torch.tensor([[1.2], [-0.7], [0.4], [-1.1], [-0.3]])
ADV_TOK = rounded(randn(B, T))

# ---------------------------------------------------------------- advantages

index = [0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3]
scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.7, 1.0, 1.0, 1.0])
N = len(index)
adv_mask = torch.ones(N, 5)
for i, n_valid in enumerate([5, 3, 1, 4, 2, 5, 0, 3, 2, 5, 4, 1]):
    adv_mask[i, n_valid:] = 0
for est, kw, tag in [("grpo", {}, "grpo"), ("grpo", {"norm_by_std": False}, "grpo_no_std"),
                     ("grpo", {"eps": 1e-4}, "grpo_cs336_eps"), ("dr_grpo", {}, "dr_grpo"),
                     ("rloo", {}, "rloo"), ("opo", {}, "opo")]:
    a = advantages_ref(est, scores, adv_mask, index, **kw)
    args = {"estimator": est}
    if "norm_by_std" in kw:
        args["norm_adv_by_std"] = kw["norm_by_std"]
    if "eps" in kw:
        args["eps"] = kw["eps"]
    note = "groups 0,1: four responses; group 2: a group of one; group 3: equal rewards (zero advantage)"
    case(f"adv_{tag}_per_response", "advantages", args,
         {"rewards": scores, "response_mask": adv_mask, "index": torch.tensor(index, dtype=torch.float64)},
         {"advantages": a}, note=note)
    case(f"adv_{tag}_per_token", "advantages", args,
         {"rewards": scores, "response_mask": adv_mask, "index": torch.tensor(index, dtype=torch.float64)},
         {"advantages": a[:, None] * adv_mask}, note=note)
# The VECTORS.md spelling: contiguous groups of group_size, no mask.
case("adv_grpo_group_size", "advantages", {"estimator": "grpo", "group_size": 4},
     {"rewards": scores}, {"advantages": advantages_ref("grpo", scores, torch.ones(N, 1), [i // 4 for i in range(N)])})
case("adv_rloo_group_size_2", "advantages", {"estimator": "rloo", "group_size": 2},
     {"rewards": scores}, {"advantages": advantages_ref("rloo", scores, torch.ones(N, 1), [i // 2 for i in range(N)])})
# REINFORCE++-baseline: group-centred, then whitened over all valid tokens (empty rows excluded).
centred = advantages_ref("reinforce_plus_plus_baseline", scores, adv_mask, index)
case("adv_reinforce_plus_plus_baseline", "advantages", {"estimator": "reinforce_plus_plus_baseline"},
     {"rewards": scores, "response_mask": adv_mask, "index": torch.tensor(index, dtype=torch.float64)},
     {"advantages": masked_whiten(centred[:, None].expand(N, 5), adv_mask) * adv_mask})
# REINFORCE++: discounted token returns (reset after each response's last valid token), whitened.
tok_rewards = rounded(randn(N, 5)) * adv_mask
for gamma in (1.0, 0.9):
    ret = torch.zeros(N, 5)
    for i in range(N):
        run = 0.0
        for t in reversed(range(5)):
            run = tok_rewards[i, t].item() + gamma * run * adv_mask[i, t + 1].item() if t + 1 < 5 else tok_rewards[i, t].item()
            ret[i, t] = run
    case(f"adv_reinforce_plus_plus_gamma_{gamma}", "advantages", {"estimator": "reinforce_plus_plus", "gamma": gamma, "group_size": 1},
         {"rewards": tok_rewards, "response_mask": adv_mask},
         {"advantages": masked_whiten(ret, adv_mask) * adv_mask})
# Outcome rewards (N,) for reinforce_plus_plus: the score sits on the last valid token.
outcome_tok = torch.zeros(N, 5)
for i in range(N):
    n_valid = int(adv_mask[i].sum())
    if n_valid:
        outcome_tok[i, n_valid - 1] = scores[i]
ret = torch.flip(torch.cumsum(torch.flip(outcome_tok, [1]), 1), [1]) * adv_mask
case("adv_reinforce_plus_plus_outcome", "advantages", {"estimator": "reinforce_plus_plus", "group_size": 1},
     {"rewards": scores, "response_mask": adv_mask}, {"advantages": masked_whiten(ret, adv_mask) * adv_mask})

# ---------------------------------------------------------------- aggregation and masked_mean

loss_mat = rounded(randn(B, T))
for mode in AGG_MODES:
    lm = loss_mat.clone().requires_grad_(True)
    out = agg(lm, MASK, mode)
    out.backward()
    case(f"agg_{mode}", "agg_loss", {"loss_agg_mode": mode}, {"loss_mat": loss_mat, "response_mask": MASK},
         {"loss": out, "grad_loss_mat": lm.grad},
         note="rows: 6 valid, 4 valid, 1 valid, none, 3 valid")
lm = loss_mat.clone().requires_grad_(True)
out = agg(lm, MASK, "seq-mean-token-sum-norm", S=100.0)
out.backward()
case("agg_seq-mean-token-sum-norm_scale_factor", "agg_loss",
     {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": 100.0},
     {"loss_mat": loss_mat, "response_mask": MASK}, {"loss": out, "grad_loss_mat": lm.grad})
case("agg_token-mean_all_masked", "agg_loss", {"loss_agg_mode": "token-mean"},
     {"loss_mat": loss_mat, "response_mask": torch.zeros(B, T)}, {"loss": torch.tensor(float("nan"))},
     note="0/0 is NaN, as in verl")

mm_x = rounded(randn(4, 5))
mm_m = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 0], [0, 1, 1, 1, 0]], dtype=torch.float64)
for dim in (None, 0, 1, -1):
    case(f"masked_mean_dim_{dim}", "masked_mean", {"dim": dim}, {"tensor": mm_x, "mask": mm_m},
         {"mean": masked_mean(mm_x, mm_m, dim)}, note="row 1 and column 4 are all masked: NaN (null)")

# ---------------------------------------------------------------- policy losses


def policy_case(name, mode, agg_mode, logp=LOGP, old=OLD, A=ADV_SEQ, M=MASK, note=None, w=None, **kw):
    lp = logp.clone().requires_grad_(True)
    L, loss, met = policy_loss_ref(mode, lp, old, A, M, agg_mode, w=w, **kw)
    loss.backward()
    args = {"loss_mode": mode, "loss_agg_mode": agg_mode}
    for k_ref, k_arg in [("lo", "clip_ratio_low"), ("hi", "clip_ratio_high"), ("c", "clip_ratio_c"),
                         ("tau_pos", "tau_pos"), ("tau_neg", "tau_neg"), ("cap", "cispo_max_ratio")]:
        if k_ref in kw:
            args[k_arg] = kw[k_ref]
    inputs = {"log_prob": logp, "old_log_prob": old, "advantages": A, "response_mask": M}
    if w is not None:
        inputs["rollout_is_weights"] = w
    expected = {"pg_losses": L, "pg_loss": loss, "grad_log_prob": lp.grad}
    expected.update({k: v for k, v in met.items()})
    case(name, "policy_loss", args, inputs, expected, note=note)


MODES = ["vanilla", "grpo_clip", "no_baseline", "reinforce_with_baseline", "gpg", "cispo", "trl_cispo", "gspo",
         "geo_mean", "sapo", "tinker_importance_sampling", "tinker_ppo", "tinker_cispo"]
for mode in MODES:
    for agg_mode in AGG_MODES:
        A = ADV_TOK if mode in ("vanilla", "cispo", "sapo", "no_baseline") else ADV_SEQ
        policy_case(f"pl_{mode}_{agg_mode}", mode, agg_mode, A=A,
                    note="ragged mask (6, 4, 1, 0, 3 valid tokens); advantages " + ("per token" if A is ADV_TOK else "(B,1)"))

policy_case("pl_vanilla_clip_higher", "vanilla", "token-mean", lo=0.2, hi=0.28, note="DAPO clip-higher")
policy_case("pl_vanilla_no_dual_clip", "vanilla", "token-mean", c=None, note="clip_ratio_c null: dual clip off")
# Ratios far outside [1/3, 3] and |D| > 20 so the exp clamp and dual clip bite.
big_old = rounded(LOGP + torch.tensor([[25.0, -25.0, 2.0, -2.0, 1.5, -1.5]] * B))
policy_case("pl_vanilla_extreme_ratios", "vanilla", "token-mean", old=big_old, A=ADV_TOK,
            note="|logp - old| up to 25: D clamped to [-20, 20]; dual clip active for A < 0")
policy_case("pl_vanilla_extreme_ratios_dual_clip_2", "vanilla", "seq-mean-token-mean", old=big_old, A=ADV_TOK, c=2.0)
policy_case("pl_cispo_verl_example", "cispo", "token-mean", lo=10.0, hi=0.2, old=big_old * 0.1 + LOGP * 0.9,
            note="verl's example: clip_ratio_low 10 (no lower bound), clip_ratio_high 0.2")
policy_case("pl_cispo_slime_0_5", "cispo", "token-mean", lo=1.0, hi=4.0, old=big_old * 0.1 + LOGP * 0.9,
            note="slime eps_clip=1.0, eps_clip_high=4.0: bounds [0, 5]")
policy_case("pl_trl_cispo_cap_3", "trl_cispo", "token-mean", cap=3.0, old=big_old * 0.1 + LOGP * 0.9)
policy_case("pl_gspo_paper_bounds", "gspo", "token-mean", lo=3e-4, hi=4e-4, note="GSPO paper: lo 3e-4, hi 4e-4")
policy_case("pl_geo_mean_token_adv", "geo_mean", "token-mean", A=ADV_TOK, lo=0.4, hi=0.4)
policy_case("pl_sapo_taus", "sapo", "token-mean", A=ADV_TOK, tau_pos=2.0, tau_neg=0.5)
IS_W = rounded(0.5 + rand(B, T))
policy_case("pl_vanilla_is_weights", "vanilla", "token-mean", w=IS_W, note="rollout IS weights times the token loss")
policy_case("pl_geo_mean_is_weights", "geo_mean", "token-mean", w=IS_W, note="geo_mean: geometric mean of weights per sequence")
for mode in ["vanilla", "gspo", "cispo", "geo_mean", "sapo", "tinker_ppo"]:
    policy_case(f"pl_{mode}_ratio_one", mode, "token-mean", old=LOGP, A=ADV_TOK,
                note="old == logp: r == 1, ppo_kl and pg_clipfrac are 0")

# ---------------------------------------------------------------- actor loss = policy + KL - entropy

ENT = rounded(2.0 * rand(B, T))
REF = rounded(LOGP + 0.4 * randn(B, T))
for mode, agg_mode, kt in [("vanilla", "token-mean", "low_var_kl"), ("gspo", "seq-mean-token-sum-norm", "k3+"),
                           ("cispo", "seq-mean-token-mean", "k1"), ("geo_mean", "token-sum", "mse")]:
    lp = LOGP.clone().requires_grad_(True)
    _, pg, _ = policy_loss_ref(mode, lp, OLD, ADV_TOK, MASK, agg_mode)
    total = pg + 0.1 * agg(kl_ref(lp, REF, kt), MASK, agg_mode) - 0.01 * agg(ENT, MASK, agg_mode)
    total.backward()
    case(f"actor_loss_{mode}_{kt}", "actor_loss",
         {"loss_mode": mode, "loss_agg_mode": agg_mode, "use_kl_loss": True, "kl_loss_coef": 0.1,
          "kl_loss_type": kt, "entropy_coeff": 0.01},
         {"log_prob": LOGP, "old_log_prob": OLD, "ref_log_prob": REF, "advantages": ADV_TOK, "response_mask": MASK,
          "entropy": ENT},
         {"loss": total, "grad_log_prob": lp.grad},
         note="pg_loss + kl_loss_coef * agg(kl) - entropy_coeff * agg(entropy), KL and entropy with loss_agg_mode")

# ---------------------------------------------------------------- KL and entropy

kl_logp = torch.tensor([[-0.5, -1.2, -30.0, -0.1, -2.0, -4.0], [-0.3, -3.0, -0.2, -8.0, -0.05, -1.0]])
kl_ref_ = torch.tensor([[-0.7, -1.0, -0.5, -26.0, -5.0, -0.9], [-0.3, -2.5, -0.9, -1.0, -6.0, -1.1]])
kl_mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.float64)
for kt in ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "abs+", "k3+", "low_var_kl+", "k2+"]:
    lp = kl_logp.clone().requires_grad_(True)
    v = kl_ref(lp, kl_ref_, kt)
    masked_mean(v, kl_mask).backward()
    case(f"kl_{kt}", "kl", {"kl_type": kt},
         {"log_prob": kl_logp, "ref_log_prob": kl_ref_, "response_mask": kl_mask},
         {"kl": v, "grad_log_prob": lp.grad},
         note="ref - logp spans -25 .. 29.5: k3's exp clamp (20) and value clamp (10) bite")

logits = rounded(3.0 * randn(2, 3, 7))
logits[0, 0] = torch.tensor([50.0, -50.0, 0.0, 1.0, 2.0, 49.0, -3.0])
logits[1, 2] = torch.zeros(7)
case("entropy_logits", "entropy", {}, {"logits": logits}, {"entropy": entropy_ref(logits)},
     note="includes logits of +-50 and a uniform row (entropy ln 7)")

# ---------------------------------------------------------------- CS336 microbatch step

mb_mask = MASK[[0, 1, 2, 4]]
mb_logp, mb_old = LOGP[[0, 1, 2, 4]], OLD[[0, 1, 2, 4]]
raw = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
mb_adv = torch.tensor([[0.9], [-0.6], [0.3], [-0.6]])
for lt in ["no_baseline", "reinforce_with_baseline", "grpo_clip"]:
    lp = mb_logp.clone().requires_grad_(True)
    losses, grads = [], []
    for _ in range(2):
        if lt == "no_baseline":
            per_tok = -raw * lp
        elif lt == "reinforce_with_baseline":
            per_tok = -mb_adv * lp
        else:
            r = torch.exp(lp - mb_old)
            per_tok = -torch.min(r * mb_adv, torch.clamp(r, 0.8, 1.2) * mb_adv)
        loss = masked_mean(per_tok, mb_mask, -1).mean() / 3
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append(lp.grad.clone())
    case(f"microbatch_step_{lt}", "microbatch_step",
         {"loss_type": lt, "cliprange": 0.2, "gradient_accumulation_steps": 3, "steps": 2},
         {"log_prob": mb_logp, "old_log_prob": mb_old, "raw_rewards": raw, "advantages": mb_adv,
          "response_mask": mb_mask},
         {"loss": torch.stack(losses), "grad_log_prob": torch.stack(grads)},
         note="two steps without zeroing: the second gradient is twice the first")

# ---------------------------------------------------------------- rollout correction

roll = rounded(OLD + 0.4 * randn(B, T))
roll[0, 0] = OLD[0, 0] - 2.0
roll[4, 1] = OLD[4, 1] + 1.5
for is_level, rs_level, thr in [("token", None, 2.0), ("sequence", None, 2.0), (None, "token", 2.0),
                                (None, "sequence", 3.0), ("token", "token", 1.5)]:
    diff = OLD - roll
    tok = torch.clamp(diff, -20, 20)
    seq = torch.clamp((diff * MASK).sum(-1, keepdim=True), -20, 20).expand(B, T)
    lvl = {"token": tok, "sequence": seq}
    exp = {"logprob_abs_diff_mean": metric_mean(diff.abs(), MASK),
           "logprob_abs_diff_max": (diff.abs() * MASK).max(),
           "kl": metric_mean(-diff, MASK),
           "k3_kl": metric_mean(torch.exp(tok) - tok - 1, MASK)}
    if is_level:
        exp["rollout_is_weights"] = torch.clamp(torch.exp(lvl[is_level]), max=thr)
    if rs_level:
        rr = torch.exp(lvl[rs_level])
        exp["response_mask"] = MASK * ((rr >= 1 / thr) & (rr <= thr)).double()
    else:
        exp["response_mask"] = MASK
    case(f"rollout_correction_is_{is_level}_rs_{rs_level}", "rollout_correction",
         {"rollout_is": is_level, "rollout_rs": rs_level, "rollout_is_threshold": thr},
         {"old_log_prob": OLD, "rollout_log_prob": roll, "response_mask": MASK}, exp)

# ---------------------------------------------------------------- KL in reward, controller

kr_mask = MASK[[0, 1, 2, 4]]
kr_scores = torch.zeros(4, T)
for i, n in enumerate([6, 4, 1, 3]):
    kr_scores[i, n - 1] = [1.0, 0.0, 1.0, 0.5][i]
kr_old, kr_ref = OLD[[0, 1, 2, 4]], roll[[0, 1, 2, 4]]
for kt, ctrl in [("k1", "fixed"), ("low_var_kl", "adaptive")]:
    kld = kl_ref(kr_old, kr_ref, kt) * kr_mask
    beta = 0.05
    current = metric_mean(kld, kr_mask, -1).mean()
    nxt = beta
    if ctrl == "adaptive":
        nxt = beta * (1 + min(max(current.item() / 0.02 - 1, -0.2), 0.2) * 4 / 100)
    case(f"kl_in_reward_{kt}_{ctrl}", "kl_in_reward",
         {"kl_type": kt, "kl_ctrl": ctrl, "kl_coef": beta, "target_kl": 0.02, "horizon": 100},
         {"token_level_scores": kr_scores, "old_log_prob": kr_old, "ref_log_prob": kr_ref, "response_mask": kr_mask},
         {"token_level_rewards": kr_scores - beta * kld, "current_kl": current, "next_kl_coef": torch.tensor(nxt)})
kls, steps = [0.01, 0.5, 0.11, 0.0, 0.09], [64, 64, 128, 32, 64]
vals, v = [], 0.2
for kl_, n in zip(kls, steps):
    v *= 1 + min(max(kl_ / 0.1 - 1, -0.2), 0.2) * n / 1000
    vals.append(v)
case("kl_controller_adaptive", "kl_controller", {"kl_ctrl": "adaptive", "kl_coef": 0.2, "target_kl": 0.1, "horizon": 1000},
     {"current_kl": torch.tensor(kls), "n_steps": torch.tensor(steps, dtype=torch.float64)}, {"values": torch.tensor(vals)})
case("kl_controller_fixed", "kl_controller", {"kl_ctrl": "fixed", "kl_coef": 0.2},
     {"current_kl": torch.tensor(kls), "n_steps": torch.tensor(steps, dtype=torch.float64)}, {"values": torch.full((5,), 0.2)})

# ---------------------------------------------------------------- write

OUT.mkdir(parents=True, exist_ok=True)
for old_file in OUT.glob("*.json"):
    old_file.unlink()
names = set()
for c in CASES:
    assert c["name"] not in names, c["name"]
    names.add(c["name"])
    (OUT / f"{c['name']}.json").write_text(json.dumps(c, separators=(",", ":")) + "\n")
print(f"wrote {len(CASES)} cases to {OUT}")
