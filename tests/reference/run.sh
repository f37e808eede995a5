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
export PYTHONDONTWRITEBYTECODE=1
exec "$python" "$@"
