#!/usr/bin/env bash
# Installs dependencies, builds kvd and runs the main job: the P/D demo. Two kvd processes start
# on free loopback ports; two prefill engines (TP 2, LBNHC, 16-token blocks) stream 16 requests
# layer by layer to one decode engine (TP 1, BLHNC, 32-token blocks), which checks every byte.
# A few seconds on a 2-core machine; exits non-zero if any request failed or any byte differed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/bin/kvbench pd --requests 16 --tokens 256 --layers 8 --prefill-tp 2 --decode-tp 1 \
  --prefill-order LBNHC --decode-order BLHNC --prefill-block-size 16 --decode-block-size 32
