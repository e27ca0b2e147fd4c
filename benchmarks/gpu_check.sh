#!/usr/bin/env bash
# The GPU check, one command on a machine with a GPU and no package index (after
# benchmarks/gpu_kit.sh packed .gpu-kit/ on one with an index): the kit's wheels installed beside
# that machine's PyTorch, then the GPU tests with their CPU twins, `seqae bench fuse`'s table (K
# trials as one pack against the same K as fractional GPUs and one after another, each row printed
# as it is measured) and `seqae bench step`'s (every step variant against the plain loop, the heads'
# parity, the syncs a step). Its timeouts hold it to 6 minutes at most (90 + 120 + 150 s); on a CPU
# it runs too, its GPU rows saying there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT="${SEQAE_GPU_KIT:-.gpu-kit}"
SITE="${SEQAE_GPU_SITE:-/tmp/seqae-gpu-site}"
if compgen -G "$KIT/*.whl" > /dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPU', torch.cuda.is_available())"
# The tests first: they are short, and a failure there says the table's figures are not to be trusted.
timeout "${SEQAE_GPU_TESTS_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" tests/test_gpu.py
# resources.fuse's figures before the step's: they are what is still owed (docs/explanation/performance.md)
timeout "${SEQAE_GPU_FUSE_TIMEOUT:-120}" python3 -m benchmarks.fuse || echo "gpu_check: bench fuse ended with exit $?"
timeout "${SEQAE_GPU_BENCH_TIMEOUT:-150}" python3 -m benchmarks.step_check "$@" || echo "gpu_check: bench step ended with exit $?"
