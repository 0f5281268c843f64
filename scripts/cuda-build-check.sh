#!/usr/bin/env bash
# The CUDA build, compiled and linked on a machine without a GPU: temper against the venv's CUDA
# libtorch (PyPI's Linux torch wheel is the CUDA one), with libtorch_cuda and c10d's NCCL
# process group, in its own target folder (target/cuda) so that the CPU build (target/, and
# .venv/libtorch, the CPU-only link view) is untouched. Then the binary must start, and
# `--device cuda` on this GPU-less machine must fail with a one-line reason.
#   scripts/cuda-build-check.sh          # about 7 minutes on 2 cores from scratch
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fail() { echo "cuda-build-check: FAIL: $*" >&2; exit 1; }
scripts/setup-env.sh
site="$(cd .venv/site && pwd -P)"
torch="$site/torch"
[[ -e "$torch/lib/libtorch_cuda.so" ]] || fail "the venv's torch has no libtorch_cuda.so (not PyPI's CUDA wheel?)"
scripts/cuda-headers.sh .venv || fail "the CUDA headers NCCL's c10d header needs"
log="target/cuda-build.log"
mkdir -p target
# An explicit LIBTORCH wins over .cargo/config.toml's (cargo's [env] never overrides the
# environment), so only this build sees the CUDA libtorch.
if ! LIBTORCH="$torch" CARGO_TARGET_DIR=target/cuda cargo build -p temper-cli 2>&1 | tee "$log"; then
  fail "cargo build against the CUDA libtorch (log: $log)"
fi
grep -q "built without NCCL\|built without c10d" "$log" && fail "$(grep -m1 'built without' "$log")"
bin=target/cuda/debug/temper
# Read the listings whole first: `| grep -q` would stop reading early, and under pipefail the
# writer's SIGPIPE fails the check.
dynamic="$(readelf -d "$bin")"
[[ "$dynamic" == *"libtorch_cuda.so"* ]] || fail "$bin does not link libtorch_cuda.so"
symbols="$(nm -D -C "$bin")"
[[ "$symbols" == *"ProcessGroupNCCL::ProcessGroupNCCL"* ]] || fail "$bin has no reference to c10d's ProcessGroupNCCL"
"$bin" --version >/dev/null || fail "$bin does not start"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  # Without a GPU, the CUDA build must say so in one line rather than crash in libtorch.
  msg="$("$bin" check-logprobs --model smollm2 --device cuda 2>&1 >/dev/null || true)"
  [[ "$msg" == *"no CUDA device is visible"* ]] || fail "--device cuda without a GPU said: $msg"
fi
echo "cuda-build-check: $bin links libtorch_cuda and c10d's ProcessGroupNCCL, starts, and says when no GPU is visible"
