#!/usr/bin/env bash
# The README's example program under `fsdp launch -n 2`: it must exit 0,
# learn (its last loss below 0.7 of its first: the same batch every step),
# and leave each rank half of the parameters.
#   check_example_mlp.sh FSDP_CLI EXAMPLE
set -uo pipefail
out=$("$1" launch -n 2 -- "$2" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: exit $rc"; exit 1; }
first=$(grep -oP 'Step 0, Loss: \K[0-9.]+' <<<"$out")
last=$(grep -oP 'Step 9, Loss: \K[0-9.]+' <<<"$out")
[[ -n $first && -n $last ]] || { echo "FAIL: no loss of step 0 or step 9"; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.7 * a) }' || { echo "FAIL: loss $first -> $last did not fall"; exit 1; }
grep -q 'rank 1 holds 16787456 parameter bytes of 33574912' <<<"$out" || { echo "FAIL: rank 1's shard"; exit 1; }
echo "PASS: loss $first -> $last, half of the parameters on each rank"
