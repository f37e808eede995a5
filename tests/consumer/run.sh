#!/usr/bin/env bash
# Builds tests/consumer/ (a LibTorch project outside fsdp.cpp's tree) one
# way and runs it under `fsdp launch`: at W = 2, then saving its own
# checkpoint at W = 2 and resuming it at W = 3.
#   run.sh package WORK_DIR        cmake --install of FSDP_BUILD_DIR into a
#                                  prefix, then find_package(fsdp) from it
#   run.sh subdirectory WORK_DIR   add_subdirectory of this source tree, with
#                                  LibTorch on CMAKE_PREFIX_PATH as a user has it
# Environment (set by CTest): FSDP_BUILD_DIR, the build to install from;
# FSDP_CLI, the launcher; FSDP_TORCH_PREFIX, the LibTorch to put on
# CMAKE_PREFIX_PATH for the subdirectory build.
set -euo pipefail
way=$1
work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
start=$SECONDS
case $way in
  package)
    cmake --install "$FSDP_BUILD_DIR" --prefix "$work/prefix" >"$work/install.log"
    # Every header the installed ones include is installed too.
    missing=$(cd "$work/prefix/include" && grep -rhoE '#include "fsdp/[^"]+"' fsdp | sort -u |
              sed -E 's/#include "(.*)"/\1/' | while read -r h; do [[ -f $h ]] || echo "$h"; done)
    if [[ -n $missing ]]; then
      echo "consumer: installed headers include headers that are not installed: $missing" >&2
      exit 1
    fi
    # Nothing but the prefix: the package finds its own LibTorch, its
    # library too, though Debian's libtorch-dev may be on the default paths.
    cmake -S "$src/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFSDP_CONSUMER_WAY=package -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
    torch_library=$(sed -n 's/^TORCH_LIBRARY:[A-Z]*=//p' "$work/build/CMakeCache.txt")
    if [[ -d $FSDP_TORCH_PREFIX/lib && $(realpath "$torch_library") != "$(realpath "$FSDP_TORCH_PREFIX")"/* ]]; then
      echo "consumer: the package found its LibTorch's headers in $FSDP_TORCH_PREFIX but the library $torch_library" >&2
      exit 1
    fi
    # A project that found Torch itself first (Torch_DIR alone), with
    # Debian's library cached beside these headers, is refused naming both,
    # as the subdirectory route refuses it, before any compile (the link
    # failed with hundreds of undefined references before).
    if [[ -e /usr/lib/x86_64-linux-gnu/libtorch.so && -d $FSDP_TORCH_PREFIX/share/cmake/Torch ]]; then
      if cmake -S "$src/tests/consumer" -B "$work/build-mixed" -G Ninja -DFSDP_CONSUMER_WAY=package \
           -DFSDP_CONSUMER_FIND_TORCH_FIRST=ON -DTorch_DIR="$FSDP_TORCH_PREFIX/share/cmake/Torch" \
           -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure-mixed.log" 2>&1; then
        if grep -q "^TORCH_LIBRARY:[A-Z]*=/usr/lib" "$work/build-mixed/CMakeCache.txt"; then
          echo "consumer: a Torch found with another LibTorch's library was not refused by the package" >&2
          exit 1
        fi
      else
        # One message, no stray ';' from a list of strings.
        tr -s ' \n' ' ' <"$work/configure-mixed.log" |
          grep -q "takes its library from /usr/lib/x86_64-linux-gnu/libtorch.so, another LibTorch's, and the link would fail" || {
          tail -20 "$work/configure-mixed.log" >&2
          exit 1
        }
      fi
    fi
    ;;
  subdirectory)
    # No build type and no fsdp.cpp options: the defaults a new user gets.
    # LibTorch named by Torch_DIR alone, on a machine that may also have
    # Debian's libtorch-dev on the default paths (CI's has): fsdp.cpp links
    # the LibTorch whose headers it compiles with.
    torch_dir="$FSDP_TORCH_PREFIX/share/cmake/Torch"
    cmake -S "$src/tests/consumer" -B "$work/build" -G Ninja \
      -DFSDP_CONSUMER_WAY=subdirectory -DFSDP_SOURCE_DIR="$src" -DTorch_DIR="$torch_dir" >"$work/configure.log"
    if ! grep -q "fsdp: LibTorch .* from $FSDP_TORCH_PREFIX" "$work/configure.log"; then
      echo "consumer: the subproject did not take the LibTorch Torch_DIR names:" >&2
      grep "fsdp: LibTorch" "$work/configure.log" >&2
      exit 1
    fi
    # A project that found Torch itself first, with Debian's library cached
    # beside these headers, is refused naming both, before any compile.
    if [[ -e /usr/lib/x86_64-linux-gnu/libtorch.so ]]; then
      if cmake -S "$src/tests/consumer" -B "$work/build-mixed" -G Ninja -DFSDP_CONSUMER_WAY=subdirectory \
           -DFSDP_CONSUMER_FIND_TORCH_FIRST=ON -DFSDP_SOURCE_DIR="$src" -DTorch_DIR="$torch_dir" \
           >"$work/configure-mixed.log" 2>&1; then
        echo "consumer: a Torch found with another LibTorch's library was not refused" >&2
        exit 1
      fi
      # CMake wraps its messages: compare with the lines joined.
      tr -s ' \n' ' ' <"$work/configure-mixed.log" |
        grep -q "its library from /usr/lib/x86_64-linux-gnu/libtorch.so, another LibTorch's" || {
        tail -20 "$work/configure-mixed.log" >&2
        exit 1
      }
    fi
    # Only the library is built: no trainer, models, CLI, benches or tests.
    extra=$(ninja -C "$work/build" -t targets all | grep -E -o '^(fsdp_cli|fsdp_models|fsdp_train|fsdp_light|fsdp_dist_tests|fsdp_example_mlp)[:.]' || true)
    if [[ -n $extra ]]; then
      echo "consumer: the subproject defines targets beyond the library: $extra" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: run.sh package|subdirectory WORK_DIR" >&2
    exit 2
    ;;
esac
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" || { tail -40 "$work/build.log"; exit 1; }
compiled=$(grep -c 'Building CXX object' "$work/build.log" || true)
echo "consumer ($way): configured and built in $((SECONDS - start)) s, $compiled translation units compiled"
"$FSDP_CLI" launch -n 2 -- "$work/build/consumer"
# Its own sharded checkpoint, saved at W = 2 and resumed at W = 3.
"$FSDP_CLI" launch -n 2 -- "$work/build/consumer" save "$work/checkpoints"
"$FSDP_CLI" launch -n 3 -- "$work/build/consumer" resume "$work/checkpoints"
