#!/usr/bin/env bash
# Installs every system dependency of fsdp.cpp from Debian's registry.
# Idempotent: when everything is present it only checks (well under a second).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU) with c10d
  libgloo-dev             # headers that c10d's ProcessGroupGloo.hpp includes
  libgoogle-glog-dev      # LibTorch logs through glog; we quiet it
  libopenblas0-openmp     # fast BLAS: the reference BLAS is ~13x slower for fp32 matmuls
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libicu-dev              # Unicode classes for GPT-2's pre-tokenisation
  zlib1g-dev              # CRC-32 checksums of checkpoint files
  libprotobuf-dev protobuf-compiler  # TensorBoard event files
  libboost-dev            # Boost.CRC: CRC-32C of TensorBoard records
  python3-crc32c          # tests: an independent CRC-32C to check TensorBoard records
  python3-matplotlib      # bench/: charts
  libgtest-dev libgmock-dev
  clang-16 libfuzzer-16-dev libclang-rt-16-dev iproute2  # tests: fuzz targets (scripts/fuzz.sh: libFuzzer, ASan, UBSan runtimes); two-host namespaces
)

sudo=()
if ((EUID != 0)); then
  sudo=(sudo)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
# npm fetches the GPT-2 tokenizer files and the demo corpus; a machine may
# have Node.js from elsewhere, so look for the command, not the package.
if ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if ((${#missing[@]} == 0)); then
  echo "setup: system dependencies present"
else
  if ((EUID != 0)) && ! command -v sudo >/dev/null; then
    echo "setup: not root and no sudo; as root run: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# OpenBLAS only helps when it is the libblas.so.3 that the loader picks.
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
if [[ -n "$blas" && "$blas" != *openblas* ]]; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas | head -n1 || true)
  if [[ -n "$alt" ]]; then
    echo "setup: selecting $alt as libblas.so.3 (was $blas)"
    "${sudo[@]}" update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null
  fi
fi
