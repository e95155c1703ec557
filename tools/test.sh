#!/usr/bin/env bash
# Installs dependencies, builds kvd and runs every test (GPU tests skip without a device); then,
# as CI does (security issue 19; SECURITY.md, "Fuzzing and sanitizers"), the base, protocol,
# daemon and connector tests under ASan+UBSan (tools/sanitize.sh, build-asan/) and every libFuzzer
# target for 30 s (tools/fuzz.sh, build-fuzz/). KV_TEST_QUICK=1 stops after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKV_WERROR=ON "$@" >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 300
[[ ${KV_TEST_QUICK:-0} == 1 ]] && exit 0

start=$(date +%s)
# The host tests of the floors that take input from engines and peers (base, protocol, daemon,
# connector); tools/sanitize.sh without --targets runs every host test.
sanitized="base_test $(sed -n 's/^kv_add_test(\([a-z_]*\).*/\1/p' tests/daemon/CMakeLists.txt \
  tests/connector/CMakeLists.txt | grep -v gpu | tr '\n' ' ')"
bash tools/sanitize.sh --targets "$sanitized"
echo "test: ASan+UBSan tests passed in $(( $(date +%s) - start )) s"
start=$(date +%s)
bash tools/fuzz.sh 30
echo "test: fuzz targets passed in $(( $(date +%s) - start )) s"
