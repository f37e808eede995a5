#!/usr/bin/env bash
# Set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
scripts/fetch_data.sh  # the tokenizer tests compare against the reference encoder it brings
cd "${FSDP_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
