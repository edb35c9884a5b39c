#!/usr/bin/env bash
# Builds paratrain against the CUDA LibTorch inside the local PyTorch wheel,
# on a machine without apt (a GPU machine): header-only dependencies come
# from third_party/vendor/ (make it with scripts/vendor-headers.sh on a Debian
# machine and bring it along). Extra arguments go to ninja (targets, -k 0).
# Build folder: build-cuda/ (PARATRAIN_CUDA_BUILD_DIR overrides).
# PARATRAIN_FAST_BUILD=1: -O1 instead of -O3 (about a third less compile
# time on a 16-core GPU machine, measured 2026-11-27; our code is glue around
# LibTorch's kernels). NDEBUG stays: LibTorch 2.x's headers carry debug-only
# asserts (RecordFunction::inputs()) that a build without it trips.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${PARATRAIN_CUDA_BUILD_DIR:-build-cuda}"
py="${PYTHON:-python3}"
torch_prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# nccl.h for the NCCL backend (comm/nccl/): the wheel's nvidia-nccl package.
nccl_include="$("$py" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "include"))' 2>/dev/null || true)"
fast=()
[ "${PARATRAIN_FAST_BUILD:-0}" = 1 ] && fast=("-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${fast[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DPARATRAIN_NCCL_INCLUDE_DIR="$nccl_include" \
    -DPARATRAIN_VENDOR_DIR="$PWD/third_party/vendor" ${PARATRAIN_CMAKE_ARGS:-}
fi
ninja -C "$dir" -j "${PARATRAIN_BUILD_JOBS:-$(nproc)}" "$@"
