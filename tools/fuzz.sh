#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/, -DKV_FUZZ=ON, kvd's libraries instrumented
# and checked by ASan+UBSan; tests/fuzz/CMakeLists.txt lists them) and runs each for a bounded
# time on a copy of its seed corpus (tests/fuzz/corpus/<target>; the copy takes what the run
# finds, the repository's stays as it is). Security issue 19; SECURITY.md, "Fuzzing".
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 60 s; every target)
#   tools/fuzz.sh --seeds                             rewrites the seeds of tests/fuzz/corpus/daemon*
# Exits non-zero on the first crash, hang, leak or sanitizer report; the reproducer is written to
# build-fuzz/artifacts/ (replay: build-fuzz/bin/fuzz_TARGET FILE). KV_FUZZ_JOBS: build jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
targets_all=(frame_decoder layout_json planner daemon daemon_auth ucx_address nccl_wire staged_wire)
seeds=0
if [[ ${1:-} == --seeds ]]; then
  seeds=1
  shift
fi
seconds=${1:-60}
[[ $# -gt 0 ]] && shift
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${targets_all[@]}")

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DKV_FUZZ=ON -DKV_WITH_CUDA=OFF -DKV_WITH_UCX=OFF \
  -DKV_BUILD_TESTS=ON >/dev/null
if [[ $seeds -eq 1 ]]; then
  cmake --build build-fuzz -j"${KV_FUZZ_JOBS:-2}" --target fuzz_daemon_seeds
  # Rewrites the seeds it writes; found inputs kept there (regression seeds) stay.
  build-fuzz/bin/fuzz_daemon_seeds tests/fuzz/corpus
  echo "fuzz: wrote tests/fuzz/corpus/daemon and tests/fuzz/corpus/daemon_auth"
  exit 0
fi
cmake --build build-fuzz -j"${KV_FUZZ_JOBS:-2}" --target "${targets[@]/#/fuzz_}"

mkdir -p build-fuzz/artifacts
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp"
# Protobuf and kvd's logs are silenced inside the targets; libFuzzer's own progress lines go to
# build-fuzz/logs/<target>.log, and its final statistics are printed here.
mkdir -p build-fuzz/logs
for target in "${targets[@]}"; do
  work=build-fuzz/corpus/$target
  mkdir -p "$work"
  cp -n tests/fuzz/corpus/$target/* "$work/" 2>/dev/null || true
  # The daemon targets wait up to 10 s for kvd at each of two points before calling it hung.
  timeout_s=10
  [[ $target == daemon* ]] && timeout_s=60
  echo "fuzz: $target for ${seconds} s"
  log=build-fuzz/logs/$target.log
  if ! build-fuzz/bin/fuzz_$target -max_total_time="$seconds" -timeout="$timeout_s" \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$target-" \
      "$work" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target FAILED (log: $log; reproducer in build-fuzz/artifacts/)" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | sed "s/^/fuzz: $target /"
done
echo "fuzz: no crash"
