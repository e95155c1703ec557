#!/usr/bin/env bash
# Runs kvd's vLLM connector against real vLLM: makes (or reuses) a venv with vllm==0.33.0 from
# PyPI (a CUDA wheel, with its torch: several GB; no GPU is needed for these tests), then runs
#   tests/python/vllm/test_real_vllm.py     vLLM's own Scheduler in both P/D roles, the connector
#                                           loaded through kv_connector_module_path "kvd.vllm"
#   tests/python/vllm/test_call_sequence.py the call-sequence harness, over vLLM's base classes
# against this checkout's python/ and build/ (cmake --build build first).
#
#   tools/test-vllm.sh [pytest args...]
#   KVD_VLLM_VENV=dir (default ~/.cache/kvd/vllm-venv)  KVD_VLLM_VERSION=0.33.0  PYTHON=python3.11
#   KVD_VLLM_WHEEL=path/to/vllm-*.whl (use a downloaded wheel instead of the index)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${KVD_VLLM_VENV:-$HOME/.cache/kvd/vllm-venv}"
version="${KVD_VLLM_VERSION:-0.33.0}"
python="${PYTHON:-python3}"
lib="${KVD_LIBRARY:-$repo/build/lib/libkvconnector.so}"
bin="${KVD_BINARY:-$repo/build/bin/kvd}"

if [[ ! -e "$lib" ]]; then
  echo "test-vllm: no $lib; build first: cmake --build build" >&2
  exit 2
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "test-vllm: creating $venv ($python -m venv)"
  "$python" -m venv "$venv"
fi
have="$("$venv/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || true)"
if [[ "$have" != "$version" ]]; then
  echo "test-vllm: installing vllm==$version into $venv (have: ${have:-none})"
  "$venv/bin/pip" install --quiet "${KVD_VLLM_WHEEL:-vllm==$version}" pytest
  have="$("$venv/bin/python" -c 'import vllm; print(vllm.__version__)')"
fi
echo "test-vllm: vLLM $have, torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
cd "$repo"
export KVD_LIBRARY="$lib" KVD_BINARY="$bin" PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}"
exec timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs \
  tests/python/vllm/test_real_vllm.py tests/python/vllm/test_call_sequence.py "$@"
