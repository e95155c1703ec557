#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/, -DKV_FUZZ=ON) and runs each for a bounded
# time on a copy of its seed corpus (tests/fuzz/corpus/<target>; the copy takes what the run
# finds, the repository's stays as it is). Security issue 19.
#   tools/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Exits non-zero on the first crash, leak or sanitizer report; the reproducer is in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DKV_FUZZ=ON -DKV_WITH_CUDA=OFF -DKV_WITH_UCX=OFF >/dev/null
cmake --build build-fuzz -j"${KV_FUZZ_JOBS:-2}" --target fuzz_frame_decoder fuzz_layout_json
for target in frame_decoder layout_json; do
  work=build-fuzz/corpus/$target
  mkdir -p "$work"
  cp -n tests/fuzz/corpus/$target/* "$work/" 2>/dev/null || true
  echo "fuzz: $target for ${seconds} s"
  (cd build-fuzz && ./bin/fuzz_$target -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "corpus/$target")
done
echo "fuzz: no crash"
