#!/usr/bin/env bash
# The CUDA build: installs PyTorch's CUDA 13 wheel (requirements-cuda.txt)
# into .venv-cuda/, builds the library, CLI and tests against its LibTorch
# with CUDA and NCCL into build-cuda/, and runs the test suite. On a machine
# without a GPU every CUDA test skips with its reason and the rest pass.
# Needs the CUDA toolkit (nvcc and headers; CUDA_HOME, default
# /usr/local/cuda). Arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -x $cuda_home/bin/nvcc ]]; then
  echo "build_cuda: no nvcc in $cuda_home/bin: install the CUDA toolkit or set CUDA_HOME" >&2
  exit 1
fi

venv=.venv-cuda
stamp=$venv/.requirements-cuda.txt
if [[ -x $venv/bin/python ]] && cmp -s requirements-cuda.txt "$stamp"; then
  echo "build_cuda: $venv present (requirements-cuda.txt unchanged)"
else
  echo "build_cuda: making $venv from requirements-cuda.txt (several GB)"
  [[ -x $venv/bin/python ]] || .venv/bin/python -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements-cuda.txt
  cp requirements-cuda.txt "$stamp"
fi
torch_dir=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')

build_dir=build-cuda
if [[ ! -f $build_dir/build.ninja ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_TORCH="$torch_dir" \
    -DCUDA_TOOLKIT_ROOT_DIR="$cuda_home" -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc"
fi
cmake --build "$build_dir" -j "$(nproc)"
"$build_dir/fsdp" --version
FSDP_TORCH=$torch_dir FSDP_BUILD_DIR=$build_dir scripts/test.sh "$@"
