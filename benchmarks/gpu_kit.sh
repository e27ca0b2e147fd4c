#!/usr/bin/env bash
# Packs what the GPU check (benchmarks/gpu_check.sh) needs on a GPU machine with no package index
# into .gpu-kit/ (git ignores it): the wheels of the packages such a machine lacks. The lent H200's
# image has PyTorch, Triton, NumPy, PyYAML, tqdm, NVML's bindings and pytest with xdist, and no
# Liger-Kernel (the gpu extra). KIT_PYTHON: that machine's Python (default 3.12, the H200's).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpu-kit
PY="${KIT_PYTHON:-3.12}"
rm -rf "$KIT"
mkdir -p "$KIT"
# The gpu extra at the version the check was built with. No dependencies: torch and triton must be
# the machine's own, built for its CUDA.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$KIT" "liger-kernel==0.8.5"
echo "gpu_kit: $(ls "$KIT" | tr '\n' ' ')($(du -sh "$KIT" | cut -f1)) in $KIT"
