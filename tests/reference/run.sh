#!/usr/bin/env bash
# run.sh PYTHON SCRIPT ARGS...: runs a reference test, or skips it (exit 77)
# when PYTHON is not there (scripts/setup.sh makes it).
python=$1
shift
if [[ ! -x $python ]]; then
  echo "SKIP: $python not found (scripts/setup.sh makes the venv with torch and transformers)"
  exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
# A native crash prints the Python stack, imports included (the DCP
# converter the tests run through `fsdp ckpt` inherits it).
export PYTHONDONTWRITEBYTECODE=1 PYTHONFAULTHANDLER=1
exec "$python" "$@"
