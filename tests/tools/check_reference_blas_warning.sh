#!/usr/bin/env bash
# The runtime warns when the reference BLAS (Debian's libblas3, ~13x slower
# for fp32 matmuls) is the one LibTorch calls, and stays quiet with
# OpenBLAS. Only a LibTorch that takes its BLAS from libblas.so.3 (Debian's
# 1.13, the CI's second build) can meet it; one that links its own (the
# wheel's MKL) skips, exit 77.
#   check_reference_blas_warning.sh FSDP_CLI
set -uo pipefail
cli=$1
reference_dir=/usr/lib/x86_64-linux-gnu/blas
# Captured first: with pipefail, `grep -q` closing the pipe early would turn
# the CLI's SIGPIPE into a failed test of the wrong branch.
version=$("$cli" --version)
if grep -q 'linked into LibTorch' <<<"$version"; then
  echo "skip: this LibTorch links its own BLAS and never loads libblas.so.3"
  exit 77
fi
[[ -f $reference_dir/libblas.so.3 ]] || { echo "FAIL: libblas3 is not installed (scripts/setup.sh installs it)"; exit 1; }
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
# The reference libblas.so.3 first on the loader's path, as on an unconfigured machine.
slow=$(env LD_LIBRARY_PATH=$reference_dir RANK=0 WORLD_SIZE=1 MASTER_PORT=$(port) "$cli" smoke --mib 1 2>&1) ||
  { echo "$slow"; echo "FAIL: smoke with the reference BLAS exited non-zero"; exit 1; }
grep -q 'warning: the reference BLAS' <<<"$slow" || { echo "$slow"; echo "FAIL: no warning with the reference BLAS"; exit 1; }
fast=$(env RANK=0 WORLD_SIZE=1 MASTER_PORT=$(port) "$cli" smoke --mib 1 2>&1) ||
  { echo "$fast"; echo "FAIL: smoke exited non-zero"; exit 1; }
if grep -q 'reference BLAS' <<<"$fast"; then echo "$fast"; echo "FAIL: a warning with OpenBLAS"; exit 1; fi
echo "PASS: warned with the reference BLAS, quiet with $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
