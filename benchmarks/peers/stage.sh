#!/usr/bin/env bash
# Fills DEST/run (default <repo>/.peers/run, git-ignored) with what device.sh reads: kvd's sources
# at COMMIT (git archive), these scripts and the UCX .debs kvd builds against. Run fetch.sh first
# (the peers' zips and Mooncake's .debs). The device tool copies the session's checkout, so DEST
# must be inside it and named in the call's carry; the call then runs
#   bash .peers/run/peers/device.sh ["LBNHC:32 BLHNC:32"]
#   usage: stage.sh REPO COMMIT UCX_DEB_DIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo=$1 commit=$2 debs=$3
run="$repo/.peers/run"
rm -rf "$run/src" "$run/peers" "$run/ucx"
mkdir -p "$run/src" "$run/peers" "$run/ucx"
git -C "$repo" archive "$commit" | tar -x -C "$run/src"
cp "$here"/*.py "$here"/device.sh "$run/peers/"
cp "$debs"/libucx0_*.deb "$debs"/libucx-dev_*.deb "$debs"/ucx-utils_*.deb "$run/ucx/"
echo "$commit" > "$run/src/COMMIT"
du -sh "$run"; ls "$run"
