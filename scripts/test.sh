#!/usr/bin/env bash
# The whole test suite, from a clean clone: sets up the venv (libtorch + reference libraries),
# then format, lint and tests, and the CUDA build's compile-and-link check. CI (.ci/run) runs exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# No incremental caches: a clean clone builds once, and they doubled target/ (a CI run ran out of disk).
export CARGO_INCREMENTAL=0
scripts/setup-env.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --quiet
# The CUDA build (libtorch_cuda, c10d's NCCL) compiles and links, in target/cuda (no GPU needed).
scripts/cuda-build-check.sh
