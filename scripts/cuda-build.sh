#!/usr/bin/env bash
# Builds paratrain against the CUDA LibTorch inside the local PyTorch wheel,
# on a machine without apt (a GPU machine): header-only dependencies come
# from third_party/vendor/ (make it with scripts/vendor-headers.sh on a Debian
# machine and bring it along). Extra arguments go to ninja (targets, -k 0).
# Build folder: build-cuda/ (PARATRAIN_CUDA_BUILD_DIR overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${PARATRAIN_CUDA_BUILD_DIR:-build-cuda}"
py="${PYTHON:-python3}"
torch_prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# nccl.h for the NCCL backend (comm/nccl/): the wheel's nvidia-nccl package.
nccl_include="$("$py" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "include"))' 2>/dev/null || true)"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DPARATRAIN_NCCL_INCLUDE_DIR="$nccl_include" \
    -DPARATRAIN_VENDOR_DIR="$PWD/third_party/vendor" ${PARATRAIN_CMAKE_ARGS:-}
fi
ninja -C "$dir" -j "${PARATRAIN_BUILD_JOBS:-$(nproc)}" "$@"
