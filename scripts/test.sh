#!/usr/bin/env bash
# Set up, build, and run the whole test suite (arguments go to ctest).
# FSDP_TORCH and FSDP_BUILD_DIR choose the LibTorch and the build folder,
# as for scripts/build.sh; the default is PyTorch 2.13 from .venv/ in build/.
#   scripts/test.sh --quick   the developers' inner loop (CONTRIBUTING.md):
#     the `unit` and `models` labels, the `quick` label (the FSDP core's
#     equivalence at W = 2 under every strategy, one reference case) and
#     the trainer's cases in QUICK_CLI_CASES; a few minutes, not the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi
if [[ ${FSDP_TORCH:-venv} == system ]]; then
  scripts/setup.sh --system  # Debian's LibTorch: its build and its cases need no venv
else
  scripts/setup.sh
fi
scripts/build.sh
scripts/fetch_data.sh  # the tokenizer tests compare against the reference encoder it brings
source scripts/compiler_cache.sh  # the projects tests configure compile through it too
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
# Training at W = 2 equal to W = 1, a bit-identical resume, a reshard
# (a parameterised case's CTest name goes on after a space).
QUICK_CLI_CASES='^(Train\.TwoRanksReproduceOneRankOnTheSameGlobalBatch|Checkpoint\.ResumeIsBitIdenticalAndOldCheckpointsArePruned|WorldSizesAndStrategies/Resharding\.LossesContinueAsIfUninterrupted/2_to_3)( |$)'
if ((quick)); then
  ctest --output-on-failure -j "$(nproc)" -L '^(unit|models|quick)$' "$@"
  ctest --output-on-failure -j "$(nproc)" -R "$QUICK_CLI_CASES" "$@"
  exit
fi
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
