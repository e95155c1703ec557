#!/usr/bin/env python3
"""Per-wave timeline of a `kvbench pd` run from the two kvds' debug logs.

kvd at --log-level debug writes one "trace <us> <event> <request> <layer> <bytes>" line per step of a
transfer (daemon/transfers.cc, destination.cc, send_queue.cc), on the steady clock both kvds share.
Events: save (the prefill engine's save_layer arrived), loads (the decode kvd got an engine's
StartLoads), request (the decode kvd starts a WantRequest), wanted (it was written to the peer's
socket), want_in (a WantRequest reached the prefill kvd), want (its checks passed), post (a layer's batch went to the transport), flushed (the
transport completed it: the data landed), notify (its LayerNotice was handed to the transport),
notice (the decode kvd received a LayerNotice and sent LayerReady to its engines); and the
backend's own steps by batch number ("batch-N"): nccl n_take, n_announced, n_enqueued, n_acked on the
sending side and n_in, n_recv, n_posted, n_scattered, n_landed on the receiving side; cuda_ipc
i_take, i_launched, i_done. The table shows the first "taken" and "landed" of each wave. `kvbench pd
--trace` adds the engines' side on its stderr: ewave (the wave's clock starts), esave (the first
save), esaved (the prefill engine's last save of the wave went out), eloads (a
decode engine sent StartLoads), einplace (its WaitLayer returned).

  kvbench pd --prewrite --trace 2> t.log      (its own kvds log at debug level to its stderr)
  tools/pd_timeline.py t.log [--window 8]
or with kvds of your own:
  kvd --log-level debug ... > prefill.log 2>&1   (and the decode kvd likewise)
  kvbench pd --prefill-daemon P.sock --decode-daemon D.sock --prewrite [--trace 2> bench.log]
  tools/pd_timeline.py prefill.log decode.log [bench.log] [--window 8]

Times are microseconds from the wave's clock start (ewave) where the engines' trace is given,
else from the wave's first event. Each column is the first (or last) such event of the wave;
"every post" is when the last of the wave's requests had its first layer posted (until then
some requests wait for their Want to be read and planned: the wave's ramp).
"lag" is notice minus flushed for the same (request, layer): how long a landed layer waited
before its engine heard of it. The last line gives each column's median over the waves after
the first (which pays for connecting).
"""
import argparse
import collections
import re
import statistics

LINE = re.compile(r"trace (\d+) (\w+) (\S+) (-?\d+) (\d+)")
# The backends' steps (TransportOptions::trace, kvd at debug level), by batch: "taken" when the
# backend's thread took the batch (nccl's sender, cuda_ipc's poster), "landed" when it learnt
# the bytes landed (nccl's ack, cuda_ipc's event).
TRANSPORT_STEPS = {"n_take": "taken", "i_take": "taken", "n_acked": "landed", "i_done": "landed"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--window", type=int, default=8, help="requests per wave (kvbench pd --window)")
    args = parser.parse_args()
    events = []
    for path in args.logs:
        with open(path) as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    events.append((int(m[1]), m[2], m[3], int(m[4]), int(m[5])))
    events.sort()
    waves = collections.defaultdict(list)
    # The transport's own steps name batches, not requests: they belong to the wave whose clock
    # started last before them (none without the engines' trace).
    wave_starts = []
    for e in events:
        if e[2].startswith("batch-"):
            continue
        number = re.search(r"(\d+)$", e[2])
        w = int(number[1]) // args.window if number else 0
        # kvbench's warm-up requests ("warmup-N") number from 0 again: their waves are -1, -2, ..
        if e[2].startswith("warmup-"):
            w = -1 - w
        if e[1] == "ewave":
            wave_starts.append((e[0], w))
        waves[w].append(e)
    for e in events:
        if not e[2].startswith("batch-"):
            continue
        started = [w for t, w in wave_starts if t <= e[0]]
        if started:
            kind = TRANSPORT_STEPS.get(e[1])
            if kind:
                waves[started[-1]].append((e[0], kind, e[2], -1, 0))
    for es in waves.values():
        es.sort()
    columns = [("eloads", "first"), ("loads", "first"), ("request", "first"),
               ("wanted", "first"), ("want_in", "first"), ("want", "first"), ("post", "first"),
               ("taken", "first"), ("landed", "first"), ("save", "last"),
               ("post", "last"), ("flushed", "last"), ("notice", "last"), ("einplace", "last"),
               ("post", "every")]
    heads = [f"{which} {kind}" for kind, which in columns]
    print("wave  " + "  ".join(f"{h:>13}" for h in heads) + "  batches  post->flushed p50/max  "
          "lag p50/max  data GB/s (first post..last flushed)")
    medians = collections.defaultdict(list)
    p50 = lambda v: int(statistics.median(v)) if v else -1
    for w, es in sorted(waves.items()):
        starts = [t for t, kind, *_ in es if kind == "ewave"]
        t0 = starts[0] if starts else es[0][0]
        at = collections.defaultdict(dict)
        last_at = collections.defaultdict(dict)
        posted = 0
        for t, kind, request, layer, size in es:
            at[kind].setdefault((request, layer), t - t0)
            last_at[kind][(request, layer)] = t - t0
            if kind == "post":
                posted += size
        first = lambda k: min(at[k].values(), default=-1)
        last = lambda k: max(last_at[k].values(), default=-1)

        def every(k):
            """When every request of the wave had its first such event: the wave's ramp."""
            by_request = {}
            for (request, _), t in at[k].items():
                by_request[request] = min(t, by_request.get(request, t))
            return max(by_request.values(), default=-1)

        pick = {"first": first, "last": last, "every": every}
        row = [pick[which](k) for k, which in columns]
        latency = sorted(at["flushed"][k] - at["post"][k] for k in at["flushed"] if k in at["post"])
        lag = sorted(at["notice"][k] - at["flushed"][k] for k in at["notice"] if k in at["flushed"])
        span = max(last("flushed") - first("post"), 1)
        gbps = posted / span / 1e3
        print(f"{w:4}  " + "  ".join(f"{v:13}" for v in row) + f"  {len(latency):7}  "
              f"{p50(latency):10}/{max(latency, default=-1):<10}  {p50(lag):5}/{max(lag, default=-1):<6}  "
              f"{gbps:.2f}")
        if w > 0:
            for h, v in zip(heads, row):
                medians[h].append(v)
    if medians:
        print("p50   " + "  ".join(f"{p50(medians[h]):13}" for h in heads))

if __name__ == "__main__":
    main()
