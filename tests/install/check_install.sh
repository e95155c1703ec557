#!/usr/bin/env bash
# Installs the build tree into a fresh prefix and uses it as a user would: the shared library
# exports only kv_* and kv::connector symbols, examples/cpp builds with find_package(kvd) and
# examples/c with pkg-config, both run, and Python's ctypes loads the installed library.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR. Cleans up after itself.
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d /tmp/kvd-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/kvd bin/kvctl bin/kvbench include/kv/connector.h include/kv/kv_connector.h \
         lib/cmake/kvd/kvdConfig.cmake lib/pkgconfig/kvconnector.pc; do
  [[ -e "$prefix/$f" ]] || { echo "install: $f missing"; exit 1; }
done
lib=$(ls "$prefix"/lib/libkvconnector.so.*.*.* | head -1)

# Every exported symbol is the C API or kv::connector.
others=$(nm -DC --defined-only "$lib" | awk '{ $1=""; $2=""; sub(/^ +/, ""); print }' |
         grep -v '^kv_' | grep -v '^kv::connector::' | grep -v '^KVCONNECTOR_' || true)
if [[ -n "$others" ]]; then
  echo "install: libkvconnector.so exports more than kv_* and kv::connector:"; echo "$others" | head
  exit 1
fi
echo "install: $(nm -D --defined-only "$lib" | grep -c ' T ') exported functions, all kv_* or kv::connector"
readelf -d "$lib" | grep -q 'SONAME.*libkvconnector.so' || { echo "install: no SONAME"; exit 1; }

cmake -S "$src/examples/cpp" -B "$work/cpp" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cpp" >/dev/null
"$work/cpp/engine"

# What examples/c/Makefile does, into the scratch folder.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
"${CC:-cc}" -O2 -Wall -Wextra -Werror -std=c11 -D_DEFAULT_SOURCE $(pkg-config --cflags kvconnector) \
  -o "$work/c-engine" "$src/examples/c/engine.c" $(pkg-config --libs kvconnector) \
  -Wl,-rpath,"$(pkg-config --variable=libdir kvconnector)"
"$work/c-engine"

python3 "$src/tests/install/ctypes_smoke.py" "$prefix/lib/libkvconnector.so"
echo "install: OK"
