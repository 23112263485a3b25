#!/usr/bin/env bash
# The test suite: set up, build, and run every test (multi-rank ones under
# fsdp-run at 2 and 4 ranks). Ends with ctest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
