#!/usr/bin/env bash
# Downloads the peers' wheels and the system libraries Mooncake needs, and trims the wheels to
# what a GPU-to-GPU transfer loads (trim_wheel.py), so that both peers, kvd's sources and the
# UCX .debs travel to the device machine in one call (64 MiB at most).
#   bash benchmarks/peers/fetch.sh [DEST]      (default: <repo>/.peers, git-ignored)
# DEST/dl/       the downloads: nixl-cu13 1.5.1, mooncake-transfer-engine-cuda13 0.3.14, .debs
# DEST/run/      what a device call carries: nixl.zip, mooncake.zip, debs-mc/*.deb
# Never commit a wheel, a zip or a .deb.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:-$here/../../.peers}"
mkdir -p "$dest/dl/whl-nixl" "$dest/dl/whl-mc" "$dest/dl/debs-mc" "$dest/run/debs-mc"
pipdl=(python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_35_x86_64)
"${pipdl[@]}" -d "$dest/dl/whl-nixl" nixl-cu13==1.5.1
"${pipdl[@]}" -d "$dest/dl/whl-mc" mooncake-transfer-engine-cuda13==0.3.14
# Mooncake's engine.so links libibverbs, libmlx5, libnuma and libcurl (not bundled). The device
# script drops every library the device already has, so only missing ones are used.
(cd "$dest/dl/debs-mc" && apt-get download libibverbs1 ibverbs-providers libnl-3-200 \
   libnl-route-3-200 libnuma1 libcurl4 libbrotli1 libgssapi-krb5-2 libidn2-0 libldap-2.5-0 \
   libnghttp2-14 libpsl5 librtmp1 libssh2-1 libcom-err2 libk5crypto3 libkrb5-3 libkrb5support0 \
   libkeyutils1 libgnutls30 libsasl2-2 libgmp10 libhogweed6 libnettle8 libp11-kit0 libtasn1-6 \
   libunistring2 libffi8)
cp "$dest"/dl/debs-mc/*.deb "$dest/run/debs-mc/"
python3 "$here/trim_wheel.py" nixl "$dest"/dl/whl-nixl/nixl_cu13-*.whl "$dest/run/nixl.zip"
python3 "$here/trim_wheel.py" mooncake "$dest"/dl/whl-mc/mooncake_transfer_engine_cuda13-*.whl \
  "$dest/run/mooncake.zip"
ls -l "$dest"/dl/whl-* "$dest/run"; du -sh "$dest/run"
