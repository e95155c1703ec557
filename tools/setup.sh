#!/usr/bin/env bash
# Installs kvd's build dependencies from Debian packages. Idempotent; silent when all is present.
# The Python package's tests run with Debian's /usr/bin/python3 and its pytest, numpy and CPU
# torch. CUDA (with NCCL) is optional and expected at /usr/local/cuda; it is never installed here.
set -euo pipefail

pkgs=(cmake ninja-build g++ pkg-config libucx-dev ucx-utils libboost-dev libprotobuf-dev
      protobuf-compiler libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev
      # tests/cluster: namespaces and tc, the harness, scrapes, promtool, a test etcd
      iproute2 python3 curl prometheus etcd-server etcd-client
      # tests/python: the kvd package's tests (Debian's CPU torch)
      python3-pytest python3-numpy python3-torch
      # tools/fuzz.sh: clang and its runtimes (libFuzzer, ASan, UBSan); tools/sanitize.sh uses
      # g++'s own (libasan, libubsan, libtsan come with it)
      clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
