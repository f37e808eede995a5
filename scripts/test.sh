#!/usr/bin/env bash
# Set up, build, and run the whole test suite (arguments go to ctest).
# FSDP_TORCH and FSDP_BUILD_DIR choose the LibTorch and the build folder,
# as for scripts/build.sh; the default is PyTorch 2.13 from .venv/ in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
scripts/fetch_data.sh  # the tokenizer tests compare against the reference encoder it brings
cd "${FSDP_BUILD_DIR:-build}"
if ! ctest --output-on-failure -j "$(nproc)" "$@"; then
  # With -j the failures' output lies far up the log; repeat its end here,
  # where a truncated CI log still shows it.
  echo "== the end of each failed test's output (from Testing/Temporary/LastTest.log) =="
  while read -r failed; do
    name=${failed#*:}
    echo "-- $name"
    awk -v name="$name" '/^[0-9]+\/[0-9]+ Test: / && substr($0, index($0, "Test: ") + 6) == name {on=1}
                          on {print} on && /end time:/ {exit}' \
      Testing/Temporary/LastTest.log | tail -40
  done <Testing/Temporary/LastTestsFailed.log
  exit 8
fi
