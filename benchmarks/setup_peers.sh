#!/usr/bin/env bash
# Creates .venv-bench in the repository root: this package beside the peers it is benchmarked
# against (benchmarks/README.md). Order matters: torch's CPU build first, then everything else
# under constraints.txt, which holds torch where it is. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-bench}  # override only to try the script elsewhere

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)

# 1. torch, CPU build, named by its local version so that pip fails at once where the CPU wheel
#    is not to be had, instead of downloading the CUDA build; the check below makes sure.
"${PIP[@]}" "torch==2.13.0+cpu" || {
    echo "setup_peers: pip found no torch 2.13.0+cpu. Give pip the CPU wheel (PIP_FIND_LINKS=DIR" \
        "holding torch-2.13.0+cpu-*.whl, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)" \
        "and rerun." >&2
    exit 1
}
check_torch() {
    "$VENV/bin/python" -W ignore -c 'import sys, torch
if torch.version.cuda is not None or not torch.__version__.startswith("2.13.0"):
    sys.exit(f"setup_peers: expected the CPU build of torch 2.13.0, got {torch.__version__} "
             f"(CUDA {torch.version.cuda}).")'
}
check_torch

# 2. This package and the peers, torch held by the constraints.
"${PIP[@]}" -c benchmarks/constraints.txt -e ".[onnx]"  # the onnxruntime contender
"${PIP[@]}" -c benchmarks/constraints.txt -r benchmarks/requirements.txt

# 3. torch is still the CPU build, and each contender's framework imports in its process.
check_torch
"$VENV/bin/python" -m benchmarks.run --check
