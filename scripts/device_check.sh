#!/usr/bin/env bash
# The GPU check, one command on a lent GPU machine (no network, a python3
# with a CUDA torch, nvcc, cmake and ninja, none of our Debian packages):
#   1. unpacks the headers and libraries we build against (made here by
#      scripts/device_deps.sh into .gpu/deps.tar.xz), builds the CLI and
#      the CUDA tests against that machine's own LibTorch;
#   2. takes a backtrace of the CLI under cuda-gdb where it crashes, runs
#      the `cuda` test label, compares `fsdp train` with bench/pytorch_peer.py
#      (FSDP2 per block, bf16 parameters, fp32 reduction, fused AdamW, SDPA;
#      eager and compiled) on GPT-2 124M and a Llama 3.2 1B shape with a
#      trace of one step, checks agreement with FSDP2 on this card
#      (tests/reference/fsdp2_alignment_test.py --device cuda: fp32 for every
#      family, bf16 against fp64), profiles one step of the 1B shape on
#      both sides (bench/gpu_kernel_summary.py), and trains gpt2-d6 and
#      llama-d6 at W = 1; `snapshot` reads a GPU memory snapshot with
#      PyTorch's own viewer; `shared` times 2 ranks sharing the GPU against
#      1 (GPT-2 124M). Phases `shapes` (the Llama 3.2 3B shape at 1 x 8192
#      against FSDP2 eager), `overhead` (GPT-2 of many small blocks:
#      fsdp.cpp, FSDP2 and eager PyTorch), `dropout` (GPT-2 124M with and
#      without dropout), `peak1b` (the 1B shape's peak memory, both
#      sides), `offload` (each offload mode against FSDP2's
#      CPUOffloadPolicy on GPT-2 124M and the 1B shape) and `overlap` (a
#      traced W = 2 step of ranks sharing the card, with CPU offload) run
#      only when FSDP_CHECK_PHASES names them. The issue "On the card"
#      runs FSDP_CHECK_PHASES="tests offload overlap" with
#      FSDP_CUDA_TEST_FILTER='*Offload*:*ManyRanks*' in one call.
# Every step has a time limit inside a total budget (FSDP_CHECK_SECONDS,
# default 540), so a hang costs one step, not the lease. Logs and results go
# to $OUT (default out/device-check).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/device-check}
mkdir -p "$out" "$out/runs"
exec > >(tee "$out/main.log") 2>&1
budget=${FSDP_CHECK_SECONDS:-540}
# Which parts run after the build (a lease is short: split them over calls).
phases=" ${FSDP_CHECK_PHASES:-backtrace tests snapshot shared bench profile align train} "
begin=$SECONDS

want() { [[ $phases == *" $1 "* ]]; }

# Runs "$@" with at most LIMIT seconds, less where the budget has less left.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - (SECONDS - begin)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    echo "=== $name: skipped, ${left}s of the budget left"
    return 1
  fi
  echo "=== $name (limit ${limit}s, $((SECONDS - begin))s in)"
  local t0=$SECONDS rc
  if [[ $(type -t "$1") == function ]]; then
    timeout --kill-after=5 "$limit" bash -c "$(declare -f "$1"); cli=$cli; $*"
  else
    timeout --kill-after=5 "$limit" "$@"
  fi
  rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
  return $rc
}

echo "=== machine"
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
lscpu | grep -m1 'Model name'
nproc
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
g++ --version | head -1
cmake --version | head -1
nvcc --version | tail -1
command -v ninja

deps=/tmp/fsdp-deps
mkdir -p "$deps"
tar xJf .gpu/deps.tar.xz -C "$deps"
D=$deps/usr
export LD_LIBRARY_PATH=$D/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
build=build-cuda
step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_TORCH="$torch_dir" \
  -DCMAKE_PREFIX_PATH="$D" -DICU_ROOT="$D" -DBoost_INCLUDE_DIR="$D/include" -DBoost_NO_BOOST_CMAKE=ON \
  -DProtobuf_PROTOC_EXECUTABLE="$D/bin/protoc" -DProtobuf_INCLUDE_DIR="$D/include" \
  -DProtobuf_LIBRARY="$D/lib/x86_64-linux-gnu/libprotobuf.so" -DZLIB_INCLUDE_DIR="$D/include" \
  -DCUDA_TOOLKIT_ROOT_DIR="$cuda_home" -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DTORCH_CUDA_ARCH_LIST=9.0 \
  >"$out/runs/configure.log" 2>&1 || { tail -40 "$out/runs/configure.log"; exit 1; }
targets=(fsdp_cli)
want tests && targets+=(fsdp_cuda_tests)
step build 330 cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" -- -k 0 >"$out/build.log" 2>&1
grep -E "error|FAILED" "$out/build.log" | head -40
[[ -x $build/fsdp ]] || exit 1
cli=$PWD/$build/fsdp
"$cli" --version

# Where a process crashes on its way out, the stack: the CLI alone, no launcher.
# Where a process dies on its way out: the CLI alone and under the
# launcher, the child's own exit status, then the launcher under cuda-gdb.
backtraces() {
  local real=${cli}.real
  [[ -x $real ]] || real=$cli
  echo "##### smoke alone"
  "$real" smoke --device cuda >/dev/null 2>&1
  echo "rc=$?"
  echo "##### smoke alone, with a flight-recorder folder as under the launcher"
  FSDP_FLIGHT_RECORDER_DIR=$(mktemp -d) FSDP_LAUNCH_READS_FLIGHT_RECORDS=1 "$real" smoke --device cuda >/dev/null 2>&1
  echo "rc=$?"
  echo "##### launch -n 1 -- true"
  "$real" launch -n 1 -- true
  echo "rc=$?"
  echo "##### launch -n 1 -- smoke, the child's status seen by a shell"
  "$real" launch -n 1 -- bash -c "$real smoke --device cuda >/dev/null 2>&1; echo child rc=\$?"
  echo "rc=$?"
  echo "##### launch -n 1 -- smoke --device cpu"
  "$real" launch -n 1 -- "$real" smoke --device cpu >/dev/null 2>&1
  echo "rc=$?"
  echo "##### the launcher under cuda-gdb"
  cuda-gdb -batch -ex run -ex bt --args "$real" launch -n 1 -- "$real" smoke --device cuda 2>&1 |
    grep -v '^\[New Thread\|^\[Thread\|^warning: Cuda\|^$'
}
if want backtrace; then
  step backtrace 60 backtraces >"$out/backtrace.log" 2>&1
  grep -E "^#####|rc=|received signal|Inferior 1|^#[0-9]+ " "$out/backtrace.log" | head -60
fi

# FSDP_CHECK_DIRECT=1: `fsdp launch -n 1 -- CMD` runs CMD itself (the rank
# alone is a W = 1 job), so what follows does not depend on the launcher.
if [[ ${FSDP_CHECK_DIRECT:-0} == 1 ]]; then
  mv "$cli" "$cli.real"
  cat >"$cli" <<'SHIM'
#!/usr/bin/env bash
if [[ ${1:-} == launch ]]; then
  while [[ $# -gt 0 && $1 != -- ]]; do shift; done
  shift
  exec "$@"
fi
exec "$0.real" "$@"
SHIM
  chmod +x "$cli"
fi

want tests && step cuda-tests 240 "$build/tests/fsdp_cuda_tests" --gtest_color=no \
  --gtest_filter="${FSDP_CUDA_TEST_FILTER:-*}"

# The caching allocator's history of two ranks sharing the GPU, read by
# torch.cuda._memory_viz (tests/reference/memory_snapshot_test.py).
want snapshot && step snapshot 60 python3 tests/reference/memory_snapshot_test.py --build-dir "$build" --device cuda

# One training run: NAME then `fsdp train` arguments; W = 1 over NCCL.
train() {
  local name=$1
  shift
  step "train $name" "${TRAIN_LIMIT:-60}" "$cli" launch -n 1 -- "$cli" train --device cuda --data synthetic \
    --log-every 1 --out-dir "$out/runs/$name" "$@" >"$out/runs/$name.log" 2>&1
  tail -3 "$out/runs/$name.log"
}
# The PyTorch peer on this card: FSDP2 per block, bf16 parameters, fp32
# reduction, fused AdamW, SDPA.
peer() {
  local name=$1
  shift
  step "peer $name" "${PEER_LIMIT:-90}" "$cli" launch -n 1 -- python3 bench/pytorch_peer.py --device cuda \
    --fsdp2 --bf16 --adamw fused --metrics "$out/runs/$name.jsonl" "$@" >"$out/runs/$name.log" 2>&1
  tail -3 "$out/runs/$name.log"
  tail -2 "$out/runs/$name.jsonl" 2>/dev/null
}
# Side by side: GPT-2 124M, then the Llama 3.2 1B shape.
gpt2=(--model gpt2 --steps 12 --seq-len 1024 --batch-size 8)
llama=(--model llama3.2-1b --steps 8 --seq-len 2048 --batch-size 4)
if want bench; then
  train gpt2-124m-bf16 "${gpt2[@]}" --precision bf16 --profile-steps 10:10
  peer gpt2-124m-fsdp2-eager "${gpt2[@]}"
  PEER_LIMIT=120 peer gpt2-124m-fsdp2-compiled "${gpt2[@]}" --compile
  TRAIN_LIMIT=90 train llama1b-bf16 "${llama[@]}" --precision bf16
  peer llama1b-fsdp2-eager "${llama[@]}"
fi

step_medians() {
  python3 - "$@" <<'PY'
import json, statistics, sys
for path in sys.argv[1:]:
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except OSError:
        print(f"{path}: missing")
        continue
    t = [r["step_time_s"] for r in rows if "step_time_s" in r][4:]
    print(f"{path}: median step {statistics.median(t) * 1e3:.2f} ms over {len(t)} steps" if t else f"{path}: no steps")
PY
}
# Ranks sharing the GPU ([Note: many ranks on one GPU]): GPT-2 124M in
# bf16 on the same global batch, 1 rank against 2 whose collectives are
# staged through host shared memory; median step times in shared.txt.
if want shared; then
  train gpt2-124m-w1 --model gpt2 --steps 12 --seq-len 1024 --batch-size 8 --precision bf16
  TRAIN_LIMIT=90 step "train gpt2-124m-w2-shared" 90 "$cli" launch -n 2 -- "$cli" train --device cuda \
    --data synthetic --log-every 1 --out-dir "$out/runs/gpt2-124m-w2-shared" --model gpt2 --steps 12 \
    --seq-len 1024 --batch-size 4 --precision bf16 --profile-steps 10:10 >"$out/runs/gpt2-124m-w2-shared.log" 2>&1
  grep -m1 "share" "$out/runs/gpt2-124m-w2-shared.log"
  tail -2 "$out/runs/gpt2-124m-w2-shared.log"
  step_medians "$out/runs/gpt2-124m-w1/metrics.jsonl" "$out/runs/gpt2-124m-w2-shared/metrics.jsonl" |
    tee -a "$out/shared.txt"
fi

# Framework overhead on a GPU: GPT-2 of many small blocks (64 of width 64,
# 16 of width 256; batch 4 x 64), where each step is kernel launches and
# host work more than arithmetic. fsdp.cpp (`--init-from` a random
# Hugging Face directory of that shape, dropout 0) against FSDP2 and plain
# eager PyTorch (CUDA autocast), all bf16 with fused AdamW; median step
# time of steps 5-30.
peer_plain() {
  local name=$1
  shift
  step "peer $name" "${PEER_LIMIT:-90}" python3 bench/pytorch_peer.py --device cuda --bf16 --adamw fused \
    --metrics "$out/runs/$name.jsonl" "$@" >"$out/runs/$name.log" 2>&1
  tail -3 "$out/runs/$name.log"
}
if want overhead; then
  for shape in "64 64 4" "16 256 4"; do
    read -r layers width heads <<<"$shape"
    hf=/tmp/gpt2-${layers}x${width}
    python3 - "$hf" "$layers" "$width" "$heads" <<'PY'
import sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel
d, layers, width, heads = sys.argv[1], *map(int, sys.argv[2:])
torch.manual_seed(0)
config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257, n_positions=1024,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
GPT2LMHeadModel(config).save_pretrained(d)
PY
    small=(--seq-len 64 --batch-size 4 --steps 30)
    for rep in 1 2; do
      train "gpt2-${layers}x${width}-fsdp-r$rep" --init-from "$hf" "${small[@]}" --precision bf16
      peer "gpt2-${layers}x${width}-fsdp2-r$rep" --model gpt2-d6 --layers "$layers" --width "$width" --heads "$heads" \
        "${small[@]}"
      peer_plain "gpt2-${layers}x${width}-eager-r$rep" --model gpt2-d6 --layers "$layers" --width "$width" \
        --heads "$heads" "${small[@]}"
      step_medians "$out/runs/gpt2-${layers}x${width}-fsdp-r$rep/metrics.jsonl" \
        "$out/runs/gpt2-${layers}x${width}-fsdp2-r$rep.jsonl" "$out/runs/gpt2-${layers}x${width}-eager-r$rep.jsonl" |
        tee -a "$out/overhead.txt"
    done
  done
fi

# Dropout as GPT-2's config.json ships it (0.1) against none, GPT-2 124M,
# bf16: SDPA's dropout inside the attention kernel, LibTorch's elsewhere.
if want dropout; then
  for p in 0 0.1; do
    train "gpt2-124m-bf16-dropout$p" "${gpt2[@]}" --precision bf16 --dropout "$p"
  done
  step_medians "$out/runs/gpt2-124m-bf16-dropout0/metrics.jsonl" "$out/runs/gpt2-124m-bf16-dropout0.1/metrics.jsonl" |
    tee -a "$out/dropout.txt"
fi

# The Llama 3.2 3B shape (tied head) at 1 x 8192 in bf16: fsdp.cpp against
# FSDP2 eager, tokens/s, MFU and peak memory in each side's metrics.
if want shapes; then
  TRAIN_LIMIT=120 train llama3b-bf16 --model llama3.2-3b --steps 8 --seq-len 8192 --batch-size 1 --precision bf16
  PEER_LIMIT=120 peer llama3b-fsdp2-eager --model llama3.2-3b --steps 8 --seq-len 8192 --batch-size 1
fi

# The 1B shape's peak GPU memory on both sides (peak_device_mb in fsdp.cpp's metrics,
# peak_gpu_mb in the peer's).
if want peak1b; then
  TRAIN_LIMIT=90 train llama1b-bf16-peak "${llama[@]}" --precision bf16
  peer llama1b-fsdp2-peak "${llama[@]}"
fi

# Offload on this card (docs/memory.md, "Offload: the state on the host"):
# GPT-2 124M and the Llama 3.2 1B shape in bf16, fsdp.cpp without offload,
# with --cpu-offload (its step after backward, and overlapped with it:
# --grad-clip 0 for all of these) and with --optimizer-offload, against
# FSDP2 without offload and with CPUOffloadPolicy(pin_memory=True), each
# at its best (fused AdamW: on the device, and on the host over FSDP2's
# offloaded shards, where PyTorch has a fused CPU AdamW since 2.4).
# Median step times in offload.txt; peak_device_mb (ours) and peak_gpu_mb
# (FSDP2's) in each run's metrics.
if want offload; then
  for shape in gpt2 llama; do
    if [[ $shape == gpt2 ]]; then
      args=(--model gpt2 --steps 8 --seq-len 1024 --batch-size 8)
    else
      args=(--model llama3.2-1b --steps 6 --seq-len 2048 --batch-size 4)
    fi
    TRAIN_LIMIT=60 train "$shape-plain" "${args[@]}" --precision bf16 --grad-clip 0
    TRAIN_LIMIT=60 train "$shape-cpu-offload" "${args[@]}" --precision bf16 --grad-clip 0 --cpu-offload
    TRAIN_LIMIT=60 train "$shape-cpu-offload-overlapped" "${args[@]}" --precision bf16 --grad-clip 0 --cpu-offload \
      --overlap-host-step
    TRAIN_LIMIT=60 train "$shape-optimizer-offload" "${args[@]}" --precision bf16 --grad-clip 0 --optimizer-offload
    PEER_LIMIT=60 peer "$shape-fsdp2" "${args[@]}"
    step "peer $shape-fsdp2-cpu-offload" 90 "$cli" launch -n 1 -- python3 bench/pytorch_peer.py --device cuda \
      --fsdp2 --bf16 --adamw fused --cpu-offload --metrics "$out/runs/$shape-fsdp2-cpu-offload.jsonl" "${args[@]}" \
      >"$out/runs/$shape-fsdp2-cpu-offload.log" 2>&1
    step_medians "$out/runs/$shape-plain/metrics.jsonl" "$out/runs/$shape-cpu-offload/metrics.jsonl" \
      "$out/runs/$shape-cpu-offload-overlapped/metrics.jsonl" "$out/runs/$shape-optimizer-offload/metrics.jsonl" \
      "$out/runs/$shape-fsdp2.jsonl" "$out/runs/$shape-fsdp2-cpu-offload.jsonl" | tee -a "$out/offload.txt"
  done
fi

# Overlap on streams: one traced step (10 of 12) of two ranks sharing the
# card, GPT-2 124M in bf16 with --cpu-offload, whose Chrome trace shows the
# next unit's all-gather (and its copy in) under compute and a unit's
# reduce-scatter (and its gradient's copy out) under the next backward.
if want overlap; then
  TRAIN_LIMIT=90 step "train gpt2-124m-w2-offload-traced" 90 "$cli" launch -n 2 -- "$cli" train --device cuda \
    --data synthetic --log-every 1 --out-dir "$out/runs/gpt2-124m-w2-offload-traced" --model gpt2 --steps 12 \
    --seq-len 1024 --batch-size 4 --precision bf16 --cpu-offload --profile-steps 10:10 \
    >"$out/runs/gpt2-124m-w2-offload-traced.log" 2>&1
  tail -2 "$out/runs/gpt2-124m-w2-offload-traced.log"
fi

# Where the 1B shape's step goes, both sides: one profiled step each
# (step 9 of 10), GPU time by kind of work and the heaviest kernels
# (bench/gpu_kernel_summary.py), and the traces kept.
if want profile; then
  TRAIN_LIMIT=100 train llama1b-bf16-profiled --model llama3.2-1b --steps 10 --seq-len 2048 --batch-size 4 \
    --precision bf16 --profile-steps 9:9
  PEER_LIMIT=100 peer llama1b-fsdp2-eager-profiled --model llama3.2-1b --steps 10 --seq-len 2048 --batch-size 4 \
    --profile-step 9 --trace "$out/runs/llama1b-fsdp2-eager-step9.json"
  ours=$(find "$out/runs/llama1b-bf16-profiled" -name 'rank0.json' | head -1)
  python3 bench/gpu_kernel_summary.py "$ours" \
    "$out/runs/llama1b-fsdp2-eager-step9.json" --names fsdp.cpp FSDP2 --top 25 >"$out/profile-llama1b.md" 2>&1
  cat "$out/profile-llama1b.md"
fi

# Agreement with FSDP2 on this card (tests/reference/fsdp2_alignment_test.py):
# fp32 losses within 1e-5 for every family; bf16 against fp64.
# FSDP_ALIGN_FP32 / FSDP_ALIGN_BF16: the families of each (default: every
# family in fp32, gpt2 and llama in bf16); FSDP_ALIGN_LIMIT: seconds for each.
align_limit=${FSDP_ALIGN_LIMIT:-100}
read -ra fp32_families <<<"${FSDP_ALIGN_FP32:-}"
read -ra bf16_families <<<"${FSDP_ALIGN_BF16:-gpt2 llama}"
want align && step align-fp32 "$align_limit" python3 tests/reference/fsdp2_alignment_test.py --build-dir "$build" \
  --world 1 --device cuda ${fp32_families[@]:+--families "${fp32_families[@]}"} >"$out/align-fp32.log" 2>&1
want align && tail -8 "$out/align-fp32.log"
want align && step align-bf16 "$align_limit" python3 tests/reference/fsdp2_alignment_test.py --build-dir "$build" \
  --world 1 --device cuda --precision bf16 --families "${bf16_families[@]}" >"$out/align-bf16.log" 2>&1
want align && tail -6 "$out/align-bf16.log"

want train && train gpt2-d6-fp32 --model gpt2-d6 --steps 20 --seq-len 256 --batch-size 8
want train && train llama-d6-bf16 --model llama-d6 --steps 20 --seq-len 256 --batch-size 8 --precision bf16

echo "=== done in $((SECONDS - begin))s"
# Traces on their own (the largest files), then everything else in one archive.
find "$out/runs" -name '*.json' -size +1M | while read -r trace; do
  name=$(echo "${trace#"$out/runs/"}" | tr '/' '_')
  gzip -c "$trace" >"$out/trace_$name.gz" && rm "$trace"
done
tar czf "$out/runs.tar.gz" -C "$out" runs && rm -rf "$out/runs"
ls -la "$out"
