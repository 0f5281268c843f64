#!/usr/bin/env bash
# The Python packages `bench grpo --device cuda` needs that the device machines' image lacks (TRL
# and datasets; see the device tool's KINDS.md), downloaded here as wheels for Python 3.12 into
# .gpu/whl, which scripts/gpu-lease.sh installs there (--no-deps: the rest is in the image).
#   scripts/gpu-wheels.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.gpu/whl"
mkdir -p "$out"
"${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$out" trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls "$out"
