#!/usr/bin/env bash
# Installs dependencies, builds kvd and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/bin/kvctl plan --src tools/examples/prefill_lbnhc.json --dst tools/examples/decode_blhnc.json \
  --src-blocks 5,9,2 --dst-blocks 7,3 --tokens 40
