#!/usr/bin/env bash
# The CUDA headers c10d's ProcessGroupNCCL.hpp needs beyond what PyPI's CUDA torch wheel brings:
# crt/host_config.h (nvidia-cuda-crt) and, from CUDA 13, CCCL's nv/target (nvidia-cuda-cccl),
# each at the version of the wheel's CUDA runtime. Headers only: nothing here runs.
#   scripts/cuda-headers.sh VENV
set -euo pipefail
venv="$1"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
runtime="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime"))')"
series="${runtime%.*}.*"   # 13.0.96 -> 13.0.*
want=()
compgen -G "$site/nvidia/*/include/crt/host_config.h" >/dev/null || want+=("nvidia-cuda-crt==$series")
compgen -G "$site/nvidia/*/include/nv/target" >/dev/null || want+=("nvidia-cuda-cccl==$series")
(( ${#want[@]} == 0 )) && exit 0
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${want[@]}" \
  || { echo "temper: pip could not install ${want[*]} (CUDA headers for NCCL)" >&2; exit 1; }
