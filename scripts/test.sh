#!/usr/bin/env bash
# Installs what is missing, builds everything, runs the whole CTest suite.
# Extra arguments go to ctest (e.g. -R Ddp).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
# Multi-rank tests run ranks as threads or processes on 2 cores: two tests at
# a time keeps the machine busy without starving the timing-sensitive ones.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ctest --test-dir build --output-on-failure -j "${PARATRAIN_TEST_JOBS:-2}" "$@"
