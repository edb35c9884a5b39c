#!/usr/bin/env bash
# Configures and builds paratrain (Release, ccache, Ninja) into build/.
# Extra arguments go to `cmake --build` (e.g. --target test_ddp).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Hash paths relative to the checkout, so a fresh clone elsewhere (CI) hits
# the cache that an earlier build filled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# Two cores, ~1.3 GB per torch translation unit: two jobs is the sweet spot.
jobs="${PARATRAIN_BUILD_JOBS:-$(nproc)}"
if [ ! -f build/build.ninja ] || [ -n "${PARATRAIN_CMAKE_ARGS:-}" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${PARATRAIN_CMAKE_ARGS:-}
fi
cmake --build build -j "$jobs" "$@"
