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
# GoogleTest cases skipped inside a CTest case (a dist_wN case runs a whole
# binary) show only in the log: one line counts them, so a new skip is seen.
skip_census() {
  awk '/^[0-9]+\/[0-9]+ Test: / { test = $3 }
       match($0, /\[  SKIPPED \] [^ ]+ \([0-9]+ ms\)/) {
         name = substr($0, RSTART + 13, RLENGTH - 13); sub(/ \(.*/, "", name)
         if (!((test, name) in seen)) { seen[test, name] = 1; per[test]++; total++ }
       }
       END {
         if (total == 0) { print "skipped inside the CTest cases: none"; exit }
         line = ""
         for (t in per) line = line (line == "" ? "" : ", ") t " " per[t]
         print "skipped inside the CTest cases: " total " GoogleTest case(s) (" line "); the reasons: " \
               "grep -B2 SKIPPED " ENVIRON["PWD"] "/Testing/Temporary/LastTest.log"
       }' Testing/Temporary/LastTest.log
}
if ! ctest --output-on-failure -j "$(nproc)" "$@"; then
  skip_census
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
skip_census
