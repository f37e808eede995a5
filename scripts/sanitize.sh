#!/usr/bin/env bash
# Builds the whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer
# into build-asan/ and runs it. LibTorch itself is not instrumented: what is
# checked is our code and its use of LibTorch's memory.
#   scripts/sanitize.sh            build and run every test
#   scripts/sanitize.sh -L unit    extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FSDP_ASAN_DIR:-build-asan}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
cmake --build "$build_dir" -j "$(nproc)"
# LibTorch's and Gloo's static state is never freed at exit: leaks are not ours to judge.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
