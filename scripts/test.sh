#!/usr/bin/env bash
# The whole test suite, from a clean clone: sets up the venv (libtorch + reference libraries),
# then format, lint and tests. CI (.ci/run) runs exactly this.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup-env.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --quiet
