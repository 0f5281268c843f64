#!/usr/bin/env bash
# temper on NVIDIA GPUs, end to end (it cannot run on a CPU-only machine; it says so and fails).
#   scripts/gpu-check.sh            # needs 2 GPUs for the last check
# It runs from the repository (building temper there) or from a bundle made by
# scripts/gpu-bundle.sh on another machine (no Rust or network needed; the machine's PyTorch).
# 1. The CUDA set-up: nvidia-smi sees the GPUs, the venv's torch has CUDA, temper links
#    libtorch_cuda and was built with c10d's NCCL (TEMPER_CUDA=1 scripts/setup-env.sh).
# 2. check-logprobs on CUDA: sampled logprobs equal the trainer's teacher-forced ones (SmolLM2).
# 3. bench train on CUDA against PyTorch/transformers on the same GPU (tok/s, f32 and bf16).
# 4. 20 steps of the main job (examples/arith-smollm2.toml) on CUDA.
# 5. Data parallel with NCCL: 3 steps on 2 GPUs (`--nproc 2`, TEMPER_DIST_BACKEND=nccl) against
#    1 GPU with the same global batch: the same per-step metrics (1e-4) and weights (1e-4 relative;
#    GPU reductions are not bitwise reproducible).
# Every failure stops the script with a line saying what is missing. Output: gpu-check/ .
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="$root/gpu-check"
fail() { echo "gpu-check: FAIL: $*" >&2; exit 1; }
step() { echo; echo "== gpu-check: $*"; }

step "1/5 the CUDA set-up"
command -v nvidia-smi >/dev/null 2>&1 || fail "nvidia-smi not found: this machine has no NVIDIA driver"
ngpu="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
(( ngpu >= 1 )) || fail "nvidia-smi lists no GPU"
echo "GPUs: $ngpu"
if [[ -f "$root/bundle-torch-version" ]]; then
  # A bundle from scripts/gpu-bundle.sh: no Rust, no network; the machine's own PyTorch (the
  # version the bundle was built for) provides libtorch and the reference side.
  py="${TEMPER_PYTHON:-python3}"
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || fail "$py's torch does not see CUDA"
  bin="$root/bin/temper"
  "$bin" --version || fail "the bundle's temper does not start against $py's torch"
else
  TEMPER_CUDA=1 scripts/setup-env.sh || fail "scripts/setup-env.sh with TEMPER_CUDA=1"
  .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || fail "the venv's torch does not see CUDA"
  [[ -e .venv/libtorch/lib/libtorch_cuda.so ]] || fail ".venv/libtorch is not the CUDA libtorch (rerun with TEMPER_CUDA=1)"
  cargo build --release -p temper-cli || fail "cargo build --release -p temper-cli"
  # (A build without NCCL says so as a cargo warning; the 2-GPU run below then fails with
  # "NCCL was requested but this temper was built without it".)
  bin="$root/target/release/temper"
  [[ -x "$bin" ]] || fail "the build did not produce $bin"
fi
rm -rf "$out"; mkdir -p "$out"

step "2/5 check-logprobs on CUDA"
"$bin" check-logprobs --model smollm2 --device cuda --max-tokens 64 -n 4 | tee "$out/check-logprobs.txt" \
  || fail "check-logprobs on CUDA"

step "3/5 bench train on CUDA vs PyTorch"
"$bin" bench train --device cuda --steps 5 --rounds 2 --python "${py:-$root/.venv/bin/python}" | tee "$out/bench-train.txt" || fail "bench train on CUDA"

step "3b/5 bench sample on CUDA vs transformers generate"
"$bin" bench sample --device cuda --batch 1,16,64 --python "${py:-$root/.venv/bin/python}" | tee "$out/bench-sample.txt" \
  || fail "bench sample on CUDA"

step "4/5 20 steps of the main job on CUDA"
"$bin" train examples/arith-smollm2.toml trainer.device=cuda trainer.total_training_steps=20 \
  trainer.test_freq=10 "trainer.default_local_dir=\"$out\"" trainer.experiment_name=main-job \
  || fail "the main job on CUDA"
[[ "$(wc -l < "$out/main-job/metrics.jsonl")" -ge 20 ]] || fail "the main job wrote fewer than 20 steps"

step "5/5 NCCL on 2 GPUs vs 1 GPU"
(( ngpu >= 2 )) || fail "the NCCL check needs 2 GPUs, nvidia-smi lists $ngpu"
common=(examples/arith-smollm2.toml trainer.device=cuda trainer.total_training_steps=3 trainer.test_freq=0
        trainer.save_freq=3 actor.ppo_micro_batch_size_per_gpu=8 "trainer.default_local_dir=\"$out\"")
"$bin" train "${common[@]}" trainer.experiment_name=one-gpu || fail "the 1-GPU run"
TEMPER_DIST_BACKEND=nccl "$bin" train --nproc 2 "${common[@]}" trainer.experiment_name=two-gpus \
  || fail "the 2-GPU NCCL run"
"${py:-$root/.venv/bin/python}" - "$out/one-gpu" "$out/two-gpus" <<'EOF' || fail "2 GPUs differ from 1 GPU"
import glob, json, sys
import torch
from safetensors.torch import load_file
one, two = sys.argv[1], sys.argv[2]
read = lambda d: [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
ma, mb = read(one), read(two)
assert len(ma) == len(mb), (len(ma), len(mb))
for a, b in zip(ma, mb):
    for k, v in a.items():
        if k.startswith(("timing_s/", "perf/")) or not isinstance(v, (int, float)):
            continue
        assert abs(v - b[k]) <= 1e-4 * max(1.0, abs(v)), f"step {a.get('step')}: {k}: {v} vs {b[k]}"
def weights(d):
    files = sorted(glob.glob(f"{d}/checkpoints/*/model/*.safetensors"))
    assert files, f"no checkpoint in {d}"
    w = {}
    for f in files:
        w.update(load_file(f))
    return w
wa, wb = weights(one), weights(two)
num = sum(float((wa[k].float() - wb[k].float()).pow(2).sum()) for k in wa)
den = sum(float(wa[k].float().pow(2).sum()) for k in wa)
rel = (num / den) ** 0.5
assert rel <= 1e-4, f"weights differ by {rel:.3e} (relative)"
print(f"metrics equal over {len(ma)} steps; weights relative difference {rel:.3e}")
EOF
echo
echo "gpu-check: all checks passed (results in $out)"
