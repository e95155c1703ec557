#!/usr/bin/env bash
# One device call (two GPUs): builds kvd, then runs kvd (kvbench pd --memory cuda), NIXL and
# Mooncake on the same request shapes, each with its copy-engine ceiling, in this one call.
# It reads everything from the carried folder $RUN (stage.sh fills it on the build machine):
#   $RUN/src/          kvd sources (git archive of the commit measured)
#   $RUN/peers/        benchmarks/peers/*.py
#   $RUN/ucx/*.deb     Debian UCX 1.13 (kvd's build and its ucx transport)
#   $RUN/nixl.zip, $RUN/mooncake.zip, $RUN/debs-mc/*.deb   (fetch.sh)
# Logs and JSON lines go to $OUT; the last lines printed are the summary.
#   usage (on the device): bash .peers/run/peers/device.sh [CASES]
#   CASES, space-separated (default "LBNHC:32 BLHNC:32"):
#     ORDER:WINDOW          kvd, NIXL and Mooncake on that layout and window
#     TP2:ORDER:WINDOW[:PW] TP 1 -> 2 (one prefill rank on GPU 0, two decode ranks on GPU 1):
#                           kvd (kvbench pd --decode-tp 2) at WINDOW, then NIXL and Mooncake
#                           (--decode-tp 2) at window PW, default WINDOW for BLHNC and min(WINDOW,
#                           8) for LBNHC (2 KiB descriptors: a window-32 wave is 8.4 M of them,
#                           about a minute per wave for NIXL at its TP 1 cost per descriptor).
#                           Each peer gets --budget-s, its share of what is left of BUDGET_S,
#                           and cuts its timed iterations to fit (down to the cold wave alone).
#                           MC_FLAGS adds flags to these Mooncake runs (e.g. "--max-batch 65536
#                           --max-inflight 65536"; default: one batch per request and rank,
#                           131,072 entries at LBNHC, the whole wave in flight).
#     kvd-pull:ORDER:WINDOW kvd alone with --mode pull (whole requests, as the peers move them)
#     offload               kvbench offload, NIXL loopback and the vLLM batched-copy method
set -uo pipefail
RUN="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
CASES="${1:-LBNHC:32 BLHNC:32}"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-420} ))  # steps past it are skipped, so the call ends in time
tmo() { local l=$(( DEADLINE - $(date +%s) - 5 )); (( l > 240 )) && l=240; echo $l; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
date -u; nvidia-smi -L; nvidia-smi topo -m | head -4; nproc
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count(), "GPUs")'

# --- kvd (Release, sm_90a), only what kvbench pd needs
if [[ ! -d /opt/ucx ]]; then
  for f in "$RUN"/ucx/*.deb; do dpkg -x "$f" /opt/ucx; done
  sed -i 's|^prefix *= */usr$|prefix = /opt/ucx/usr|' /opt/ucx/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
KVD_ENV=(CMAKE_PREFIX_PATH=/opt/ucx/usr PKG_CONFIG_PATH=/opt/ucx/usr/lib/x86_64-linux-gnu/pkgconfig
         LD_LIBRARY_PATH=/opt/ucx/usr/lib/x86_64-linux-gnu
         UCX_MODULE_DIR=/opt/ucx/usr/lib/x86_64-linux-gnu/ucx)
B=${KVD_BUILD:-/tmp/kvdbuild}
start=$(date +%s)
if [[ ! -x $B/bin/kvbench && -z ${SKIP_BUILD:-} ]]; then
  env "${KVD_ENV[@]}" cmake -S "$RUN/src" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.log" 2>&1 &&
  env "${KVD_ENV[@]}" timeout 300 cmake --build $B -j"$(nproc)" --target kvbench kvd kvconnector >> "$OUT/build.log" 2>&1
  echo "kvd build rc=$? in $(( $(date +%s) - start )) s"
fi

# --- the peers, in private folders; only their own processes see them
PN=/tmp/peerN PM=/tmp/peerM MD=/tmp/mcdeps
mkdir -p $PN $PM $MD
(cd $PN && python3 -m zipfile -e "$RUN/nixl.zip" .)
(cd $PM && python3 -m zipfile -e "$RUN/mooncake.zip" .)
for f in "$RUN"/debs-mc/*.deb; do dpkg -x "$f" $MD; done
# use a bundled system library only where the device lacks that soname
for so in $MD/usr/lib/x86_64-linux-gnu/*.so.*; do
  soname=$(objdump -p "$so" 2>/dev/null | awk '/SONAME/{print $2}')
  [[ -n $soname ]] && ldconfig -p | grep -q "^[[:space:]]*$soname (" && rm -f "$so"
done
echo "Mooncake system libraries used from the carried .debs:" $(cd $MD/usr/lib/x86_64-linux-gnu && ls *.so.* 2>/dev/null)
TORCHLIB=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
NIXL_ENV=(PYTHONPATH=$PN UCX_MODULE_DIR=$PN/nixl_cu13.libs/ucx UCX_TLS=cuda_copy,cuda_ipc,sm,tcp,self
          UCX_PROTO_INFO=y)
MC_ENV=(PYTHONPATH=$PM MC_INTRANODE_NVLINK=true LD_LIBRARY_PATH=$MD/usr/lib/x86_64-linux-gnu:$TORCHLIB)

pd() {  # kvd on one case; prints kvbench's summary lines. $3: extra kvbench flags, $4: tag suffix
  local order=$1 window=$2 tag=kvd-$1-w$2${4-${3:+-pull}}
  (( $(tmo) < 30 )) && { echo "== kvd $order window $window ${3:-}: skipped (out of time)"; return; }
  timeout "$(tmo)" env "${KVD_ENV[@]}" $B/bin/kvbench pd --memory cuda --transport ipc --tokens 4096 \
    --layers 32 --heads 8 --head-dim 128 --block-size 16 --prewrite --block-ids random \
    --prefill-order "$order" --decode-order "$order" --requests $(( window * 2 )) --window "$window" ${3:-} \
    > "$OUT/$tag.log" 2>&1
  echo "== kvd $order window $window ${3:-} (kvbench pd --transport ipc) rc=$?"
  grep -E "round|requests .* verified|bytes |runs per request|ceiling|attention" "$OUT/$tag.log" | sed 's/^/  /'
}
peer() {  # $1 nixl|mooncake, $2 order, $3 window; $4 extra harness flags, $5 log tag suffix
  local env_name script log="$OUT/$1-$2-w$3${5:-}.log"
  if [[ $1 == nixl ]]; then script=nixl_bench.py; env_name=("${NIXL_ENV[@]}")
  else script=mooncake_bench.py; env_name=("${MC_ENV[@]}"); fi
  (( $(tmo) < 30 )) && { echo "== $1 $2 window $3 ${4:-}: skipped (out of time)"; return; }
  timeout "$(tmo)" env "${env_name[@]}" python3 "$RUN/peers/$script" --memory cuda --order "$2" \
    --window "$3" ${4:-} --logdir "$OUT/logs" --json-out "$OUT/peers.jsonl" > "$log" 2>&1
  echo "(rc=$?)"; cat "$log" | cut -c1-400 | tail -25
}
TP2_LEFT=0; for c in $CASES; do [[ $c == TP2:* ]] && TP2_LEFT=$(( TP2_LEFT + 1 )); done
tp2() {  # TP 1 -> 2: kvd at window $2, then each peer at window $3 within its share of the time
  pd "$1" "$2" "--decode-tp 2" -tp2  # left (the TP2 cases still to run share it)
  local l=$(( $(tmo) - 10 ))
  peer nixl "$1" "$3" "--decode-tp 2 --budget-s $(( 2 * l / (3 * TP2_LEFT) ))" -tp2  # NIXL: 2/3
  l=$(( $(tmo) - 10 ))
  peer mooncake "$1" "$3" "--decode-tp 2 --budget-s $(( l / (2 * TP2_LEFT - 1) ))${MC_FLAGS:+ $MC_FLAGS}" -tp2
  TP2_LEFT=$(( TP2_LEFT - 1 ))
}
offload() {
  (( $(tmo) < 30 )) && { echo "== offload: skipped (out of time)"; return; }
  timeout "$(tmo)" env "${KVD_ENV[@]}" $B/bin/kvbench offload --no-busy > "$OUT/kvd-offload.log" 2>&1
  echo "== kvd offload (kvbench offload --no-busy) rc=$?"; grep -vE "^\s*$" "$OUT/kvd-offload.log" | tail -14
  (( $(tmo) < 30 )) && return
  timeout "$(tmo)" env "${NIXL_ENV[@]}" python3 "$RUN/peers/offload_bench.py" \
    --json-out "$OUT/peers.jsonl" > "$OUT/offload.log" 2>&1
  echo "(offload_bench rc=$?)"; grep -E "^(==|  )" "$OUT/offload.log" | cut -c1-300
  python3 -c "import sys; sys.path.insert(0, '$RUN/peers'); import nixl_bench as n
for t in n.ucx_proto_tables('$OUT/offload.log', skip_self=False)[:6]: print('  log:', t)"
}
for c in $CASES; do
  case $c in
    offload) offload ;;
    offload-peers:*)  # offload_bench alone; the suffix is its flags, commas kept, '+' for spaces
      f=${c#offload-peers:}; f=${f//+/ }
      timeout "$(tmo)" env "${NIXL_ENV[@]}" python3 "$RUN/peers/offload_bench.py" $f \
        --json-out "$OUT/peers.jsonl" > "$OUT/offload.log" 2>&1
      echo "(offload_bench rc=$?)"; grep -E "^(==|  )" "$OUT/offload.log" | cut -c1-300 ;;
    kvd-pull:*) c=${c#kvd-pull:}; pd "${c%%:*}" "${c##*:}" "--mode pull" ;;
    TP2:*)
      IFS=: read -r _ o w pw <<< "$c"
      [[ -z $pw ]] && { pw=$w; [[ $o == LBNHC ]] && (( w > 8 )) && pw=8; }
      tp2 "$o" "$w" "$pw" ;;
    *) o=${c%%:*} w=${c##*:}; pd "$o" "$w"; peer nixl "$o" "$w"; peer mooncake "$o" "$w" ;;
  esac
done
# the call returns at most 8 files: every log in one tarball, beside peers.jsonl
tar -C "$OUT" -czf /tmp/peer-logs.tgz --exclude=./peers.jsonl . &&
  (cd "$OUT" && find . -mindepth 1 ! -name peers.jsonl -delete) && mv /tmp/peer-logs.tgz "$OUT/logs.tgz"
date -u
