#!/usr/bin/env bash
# Gathers the header-only dependencies (and googletest's sources) from this
# Debian machine into third_party/vendor/, for machines without apt (the GPU
# machine: a PyTorch wheel, CMake, ninja, no package registry). A build there
# passes -DPARATRAIN_VENDOR_DIR=$PWD/third_party/vendor (see
# cmake/Vendored.cmake); the normal Debian build never reads this folder.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh >/dev/null
out=third_party/vendor
rm -rf "$out"
# Four folders, because GCC drops a -I folder that is also an -isystem one:
# include/ is added with -I ahead of LibTorch's own -isystem folder (the wheel
# ships an fmt 12 that spdlog 1.10 cannot use), while gloo, zlib and
# rapidcheck arrive through imported targets as -isystem.
mkdir -p "$out/include" "$out/gloo/include" "$out/zlib/include" "$out/rapidcheck/include" "$out/rapidcheck/lib" "$out/src"
# fmt and spdlog are compiled libraries on Debian; their headers also work
# header-only (FMT_HEADER_ONLY, SPDLOG_HEADER_ONLY), which is how the vendored
# build uses them, so no Debian .so has to travel.
for h in fmt spdlog CLI toml++ nlohmann; do cp -r "/usr/include/$h" "$out/include/"; done
cp -r /usr/include/gloo "$out/gloo/include/"
cp /usr/include/zlib.h /usr/include/zconf.h "$out/zlib/include/"
cp -r /usr/include/rapidcheck /usr/include/rapidcheck.h "$out/rapidcheck/include/"
# rapidcheck ships only as a static library: built for x86-64 by Debian's
# GCC 12 with the C++11 ABI, which newer GCCs and the wheels' ABI accept.
cp /usr/lib/x86_64-linux-gnu/librapidcheck.a "$out/rapidcheck/lib/"
cp -r /usr/src/googletest "$out/src/googletest"
echo "vendor-headers: $(du -sh "$out" | cut -f1) in $out"
