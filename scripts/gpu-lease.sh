#!/usr/bin/env bash
# One call of a device lease (the workplace's `device` tool): unpacks the GPU bundle carried in
# .gpu/, runs scripts/gpu-check.sh's checks for that call, and packs the outputs into $OUT.
#   Here, before the lease:
#     scripts/gpu-bundle.sh 2.11.0 && mkdir -p .gpu && cp target/gpu-bundle-2.11.0.tar.gz .gpu/
#     xz -T1 -6 -c ~/.cache/temper/gguf/SmolLM2-135M-Instruct.Q4_1.gguf > .gpu/smol.gguf.xz
#     (cd .gpu && split -n 2 -d smol.gguf.xz smol.gguf.xz.part && rm smol.gguf.xz)
#   On the device machine, two calls sent back to back (the warm machine keeps /root for 30 s):
#     bash scripts/gpu-lease.sh 1   # carry .gpu/gpu-bundle-2.11.0.tar.gz .gpu/smol.gguf.xz.part00
#     bash scripts/gpu-lease.sh 2   # carry .gpu/gpu-bundle-2.11.0.tar.gz .gpu/smol.gguf.xz.part01
#     bash scripts/gpu-lease.sh 3   # carry the bundle and .gpu/whl (scripts/gpu-wheels.sh): TRL
#     bash scripts/gpu-lease.sh 4   # carry the bundle: issue 51's overlap and issue 50's 1.5B step
# Call 1 stashes its half of the real SmolLM2 under /root/stash and runs the checks that random
# weights of SmolLM2's shape serve (logprobs, graphs vs eager, sampling throughput); call 2 joins
# the halves (if the first is still there) and runs the main job and the server on the real
# model. GPU_CHECK_ONLY overrides a call's checks.
set -uo pipefail
call="${1:?call 1 or 2}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ver="${GPU_BUNDLE_VERSION:-2.11.0}"
stash=/root/stash
mkdir -p "$stash"
export TEMPER_CACHE="$stash/temper-cache"
tar -xzf "$repo/.gpu/gpu-bundle-$ver.tar.gz" -C /root || { echo "gpu-lease: no bundle in .gpu/"; exit 1; }
bundle="/root/gpu-bundle-$ver"
# The checkout's scripts and tools, newer than the bundle's copies where they changed since.
cp "$repo/scripts/gpu-check.sh" "$bundle/scripts/" && cp "$repo"/tools/*.py "$bundle/tools/"
for part in "$repo"/.gpu/smol.gguf.xz.part*; do
  [[ -f "$part" ]] && cp "$part" "$stash/"
done
gguf="$TEMPER_CACHE/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$gguf" && -f "$stash/smol.gguf.xz.part00" && -f "$stash/smol.gguf.xz.part01" ]]; then
  mkdir -p "$(dirname "$gguf")"
  cat "$stash"/smol.gguf.xz.part0{0,1} | xz -d > "$gguf.tmp" && mv "$gguf.tmp" "$gguf"
  echo "gpu-lease: the real SmolLM2 GGUF joined ($(stat -c %s "$gguf") bytes)"
fi
# Wheels the image lacks (scripts/gpu-wheels.sh), for TRL on the GPU.
if compgen -G "$repo/.gpu/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$repo"/.gpu/whl/*.whl && export PYTHONPATH=/tmp/site
fi
case "$call" in
  1) only="graphs-vs-eager-f32 bench-sample-qwen-shape bench-sample-f32 bench-sample-bf16-alone bench-sample-bf16-sdpa" ;;
  2) only="check-logprobs-f32 check-logprobs-bf16 main-job-cuda bench-serve-cuda bench-sample-bf16" ;;
  # Issues 50 and 51 on one GPU (about 6 minutes; random weights of SmolLM2's shape serve).
  4) only="async-main-job-bound-0 async-main-job-bound-1 async-main-job-bound-2 bench-train-qwen1.5b-shape"
     export GPU_CHECK_BUDGET_S="${GPU_CHECK_BUDGET_S:-560}" ;;
  # A call of its own (about 6 minutes), with scripts/gpu-wheels.sh's wheels in .gpu/whl carried.
  *) only="bench-grpo-cuda" ;;
esac
export GPU_CHECK_ONLY="${GPU_CHECK_ONLY:-$only}"
export GPU_CHECK_OUT="/root/gpu-check-$call"
export GPU_CHECK_BUDGET_S="${GPU_CHECK_BUDGET_S:-330}"
(cd "$bundle" && PYTHONUNBUFFERED=1 scripts/gpu-check.sh)
rc=$?
# The outputs without checkpoints and weights (they do not fit the way back).
tar -czf "${OUT:-/tmp}/gpu-check-$call.tar.gz" -C /root --exclude='*.safetensors' \
  --exclude='*.pt' --exclude='checkpoints' --exclude='global_step_*' "gpu-check-$call"
exit $rc
