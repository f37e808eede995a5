#!/usr/bin/env bash
# Builds the libFuzzer targets (Debian's clang-16, AddressSanitizer +
# UndefinedBehaviorSanitizer) into build-fuzz/ and runs each for SECONDS
# (default 60) from its seed corpus in tests/fuzz/corpus/. Inputs that add
# coverage collect in build-fuzz/corpus/; a crash leaves its input in
# build-fuzz/artifacts/ and fails the script.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Targets: checkpoint_metadata config hf_config token_file tokenizer tokenizer_json safetensors chat_template.
# Exits 77 (a skip, to CTest) when clang-16 or libFuzzer is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(checkpoint_metadata config hf_config token_file tokenizer tokenizer_json safetensors chat_template)
cxx=clang++-16
if ! command -v "$cxx" >/dev/null || [[ ! -f /usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a ]]; then
  echo "fuzz: skipped: clang-16 and libfuzzer-16-dev are not installed (scripts/setup.sh installs them)"
  exit 77
fi
out=build-fuzz
mkdir -p "$out/obj" "$out/artifacts"
# vptr checks are off: LibTorch (built by gcc, uninstrumented) would trip
# them on its own shared_ptr control blocks.
common=(-std=c++17 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined
        -D_GLIBCXX_USE_CXX11_ABI=1 -Iinclude -Itests/fuzz)
# Objects compile through ccache where scripts/compiler_cache.sh set it up;
# with the folder left out of the hash, a fresh clone reuses them (their
# debug information then names the first clone's folder).
launch=()
if [[ -n ${CMAKE_CXX_COMPILER_LAUNCHER:-} ]]; then
  launch=("$CMAKE_CXX_COMPILER_LAUNCHER")
  export CCACHE_NOHASHDIR=1
fi
torch=(-isystem /usr/include/torch/csrc/api/include)

# The sources each target needs, compiled with coverage instrumentation.
declare -A sources=(
  [checkpoint_metadata]="src/checkpoint/metadata.cpp src/io/input_file.cpp"
  [config]="src/train/config.cpp src/train/config_checks.cpp src/io/input_file.cpp src/common/suggest.cpp src/models/hf/config_reader.cpp src/models/hf/shard_index.cpp src/models/wrap_policy.cpp"
  [hf_config]="src/models/hf/config_reader.cpp $(echo src/models/*/config.cpp) src/common/suggest.cpp"
  [token_file]="src/data/token_file.cpp src/io/atomic_file.cpp src/io/input_file.cpp"
  [tokenizer]="src/data/tokenizer.cpp src/data/tokenizer_decoders.cpp src/data/tokenizer_json.cpp src/data/tokenizer_tables.cpp src/io/input_file.cpp"
  [tokenizer_json]="src/data/tokenizer.cpp src/data/tokenizer_decoders.cpp src/data/tokenizer_json.cpp src/data/tokenizer_tables.cpp src/io/input_file.cpp"
  [safetensors]="src/io/safetensors.cpp src/io/streamed_read.cpp src/io/atomic_file.cpp src/io/input_file.cpp src/common/error_text.cpp"
  [chat_template]="$(echo src/data/chat_template_*.cpp) src/io/input_file.cpp"
)
declare -A libs=(
  [checkpoint_metadata]="-lz"
  [config]="-lyaml-cpp"
  [hf_config]=""
  [token_file]=""
  [tokenizer]="-licuuc -licui18n"
  [tokenizer_json]="-licuuc -licui18n"
  [safetensors]="-ltorch -ltorch_cpu -lc10 -lz"
  [chat_template]="-licuuc -licui18n"
)

object() {  # source -> object, rebuilt when the source or a header changed
  local src=$1 obj="$out/obj/$(echo "$1" | tr / _).o"
  if [[ ! -f $obj || $src -nt $obj || -n $(find include src tests/fuzz -newer "$obj" -name '*.h' -print -quit) ]]; then
    local extra=()
    [[ $src == *safetensors* || $src == *error_text* ]] && extra=("${torch[@]}")
    "${launch[@]}" "$cxx" "${common[@]}" "${extra[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  echo "$obj"
}

# -timeout is per input: 30 s, not less, because CTest runs this beside
# multi-rank tests on two cores; a real hang or blow-up still exceeds it.
# clang-16's ASan cannot always place its shadow memory when the kernel
# randomises mmap with more than 28 bits (vm.mmap_rnd_bits); it then dies
# at start, at random. Running without address randomisation avoids that.
norandom=()
setarch "$(uname -m)" -R true 2>/dev/null && norandom=(setarch "$(uname -m)" -R)
status=0
printf '%-20s %10s %8s %8s %8s\n' target executions exec/s coverage corpus
for t in "${targets[@]}"; do
  [[ -n ${sources[$t]+x} ]] || { echo "fuzz: unknown target '$t'"; exit 2; }
  objs=()
  for s in ${sources[$t]}; do objs+=("$(object "$s")"); done
  extra=()
  [[ $t == safetensors ]] && extra=("${torch[@]}")
  "$cxx" "${common[@]}" "${extra[@]}" "-DFSDP_SOURCE_DIR=\"$PWD\"" -fsanitize=fuzzer "tests/fuzz/fuzz_$t.cpp" \
    "${objs[@]}" ${libs[$t]} -o "$out/fuzz_$t"
  mkdir -p "$out/corpus/$t"
  log="$out/fuzz_$t.log"
  if ! ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "${norandom[@]}" "$out/fuzz_$t" "$out/corpus/$t" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -print_final_stats=1 \
      -rss_limit_mb=4096 -timeout=30 -artifact_prefix="$out/artifacts/${t}-" >"$log" 2>&1; then
    echo "fuzz: $t FAILED; its log: $log"
    grep -m 20 -E "ERROR|runtime error|SUMMARY|deadly signal|Test unit written" "$log" || tail -20 "$log"
    status=1
    continue
  fi
  runs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" || echo 0)
  speed=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" || echo 0)
  cov=$(grep -oP 'cov: \K[0-9]+' "$log" | tail -1 || echo 0)
  printf '%-20s %10s %8s %8s %8s\n' "$t" "$runs" "$speed" "$cov" "$(ls "$out/corpus/$t" | wc -l)"
done
exit $status
