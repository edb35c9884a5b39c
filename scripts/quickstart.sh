#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install what is missing, build,
# and train the default model (MLP on Fashion-MNIST) with DDP on 2 local
# processes. Metrics and checkpoints land in runs/fashion_mnist_mlp/version_N/
# (a new version per run; continue the newest with --set train.resume=auto).
# Extra arguments go to `paratrain train` (e.g. --set train.epochs=1).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh --target paratrain
exec build/paratrain launch --nproc-per-node 2 -- \
  build/paratrain train --config configs/fashion_mnist_mlp.toml "$@"
