#!/usr/bin/env bash
# Configures and builds fsdp.cpp (Release) into build/. Incremental after the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FSDP_BUILD_DIR:-build}
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build_dir" -j "$(nproc)"
