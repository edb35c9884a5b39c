#!/usr/bin/env bash
# Installs every package paratrain needs from Debian (idempotent: packages
# already present are skipped, so a second run costs a second).
set -euo pipefail

packages=(
  cmake g++ ninja-build ccache mold pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev librapidcheck-dev zlib1g-dev
  dataset-fashion-mnist
  gnuplot-nox     # `paratrain plot` draws PNG curves with it
  doxygen         # the API reference (cmake --build build --target docs) and its CTest
  fortunes fortunes-min   # the default text corpus of configs/gpt_fortunes.toml
  python3-torch   # only for the PyTorch-DDP side of the benchmark
  libsodium-dev   # federated.secure_aggregation: X25519 key agreement and ChaCha20 masks
  libopenmpi-dev openmpi-bin   # the MPI backend (world.backend = "mpi") and its CTest runs under mpirun
  slurm-wlm munge   # Slurm.PrivateCluster: a private one-node cluster in a test (its daemons are not started here)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Debian's LibTorch calls the system BLAS through the alternatives system; with
# the reference BLAS a matrix product is ~10x slower. Make OpenBLAS the one.
alt=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
current=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || true)
if [ -e "$alt" ] && [ "$current" != "$(readlink -f "$alt")" ]; then
  echo "install-deps: switching libblas.so.3 to OpenBLAS ($alt)"
  $sudo update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt"
  $sudo update-alternatives --set liblapack.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack.so.3 || true
fi
echo "install-deps: BLAS in use: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu)"
