#!/usr/bin/env bash
# The main job: set up, build, and run a 2-rank smoke test through the launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/fsdp launch -n 2 -- build/fsdp smoke
