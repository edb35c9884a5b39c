#!/usr/bin/env bash
# One-shot look at a GPU machine for the CUDA port: what it has (env.txt),
# its LibTorch headers brought back to port against here (torch-include.*),
# and whether configure + the first libraries build (cfg.log, build.log).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
tp=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
{
  nvidia-smi -L
  python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "abi", torch._C._GLIBCXX_USE_CXX11_ABI, "avail", torch.cuda.is_available(), "nccl", torch.cuda.nccl.version())'
  python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'
  for c in gcc g++ cmake ninja nvcc ccache mold ld.lld mpirun; do echo "== $c: $(command -v $c) $($c --version 2>&1 | head -1)"; done
  nproc; ls /usr/include/zlib.h /usr/local/cuda/include/cuda_runtime.h 2>&1
  ls "$tp/include"; ls "$tp/lib" | head -50
  find / -name nccl.h -not -path '/proc/*' 2>/dev/null | head
  ls "$tp/include/torch/csrc/distributed/c10d" | head -100
} > "$OUT/env.txt" 2>&1
nccl_inc=$(dirname "$(find / -name nccl.h -not -path '/proc/*' 2>/dev/null | head -1)")
tar -C "$tp" -cf - include | xz -T16 -6 | split -b 15m - "$OUT/torch-include.tar.xz."
tar -C "$nccl_inc" -cf - nccl.h | xz > "$OUT/nccl-include.tar.xz"
export PARATRAIN_BUILD_JOBS=16
timeout 200 ./scripts/cuda-build.sh -k 0 paratrain_core paratrain_comm > "$OUT/build.log" 2>&1
echo "build rc=$?" >> "$OUT/build.log"
cp build-cuda/CMakeFiles/CMakeOutput.log "$OUT/cfg.log" 2>/dev/null
ls -la "$OUT"
