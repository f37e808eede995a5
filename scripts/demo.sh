#!/usr/bin/env bash
# The main job: set up, build, fetch the corpus and GPT-2's tokenizer files,
# tokenize, train a small GPT-2 with FULL_SHARD on 2 local ranks, and print
# a generated sample: about 10 minutes the first time on 2 cores (most of
# it the build), 3 after (README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
FSDP_BUILD_TARGETS=fsdp_cli scripts/build.sh  # the CLI alone; scripts/test.sh builds the rest
scripts/fetch_data.sh
if [[ ! -s data/sotu-tokens/train.bin ]]; then
  build/fsdp data prepare --input data/sotu --out-dir data/sotu-tokens
fi
build/fsdp launch -n 2 -- build/fsdp train --config configs/gpt2-sotu.yaml
