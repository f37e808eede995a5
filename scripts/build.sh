#!/usr/bin/env bash
# Configures and builds fsdp.cpp (Release). Incremental after the first run.
#   FSDP_TORCH      which LibTorch: venv (default: PyTorch 2.13 from .venv/),
#                   system (Debian's 1.13), or a LibTorch directory
#   FSDP_BUILD_DIR  where to build (default build/)
#   FSDP_BUILD_TARGETS  space-separated targets to build (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
#   FSDP_CCACHE     0: compile without ccache (scripts/compiler_cache.sh)
build_dir=${FSDP_BUILD_DIR:-build}
torch=${FSDP_TORCH:-venv}
source scripts/compiler_cache.sh
configured=$(sed -n 's/^FSDP_TORCH:STRING=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
if [[ ! -f "$build_dir/build.ninja" || "$configured" != "$torch" || "$launcher" != "$CMAKE_CXX_COMPILER_LAUNCHER" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_TORCH="$torch" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER"
fi
targets=()
for t in ${FSDP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
# What is built and how far along: ninja's status line with the share done
# and the time so far. A first build takes minutes on 2 cores (everything
# 11.5, the CLI alone 6.4; README.md); later ones rebuild what changed.
# shellcheck disable=SC2086
left=$(ninja -C "$build_dir" -n ${FSDP_BUILD_TARGETS:-all} 2>/dev/null | grep -c '^\[' || true)
if ((left > 0)); then
  echo "build: ${left} step(s) to build in ${build_dir}/ (LibTorch: ${torch}); ninja shows each as [done/total]"
fi
export NINJA_STATUS=${NINJA_STATUS:-"[%f/%t %p %es] "}
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
