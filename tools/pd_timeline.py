#!/usr/bin/env python3
"""Per-wave timeline of a `kvbench pd` run from the two kvds' debug logs.

kvd at --log-level debug writes one "trace <us> <event> <request> <layer> <bytes>" line per step of a
transfer (daemon/transfers.cc, destination.cc, send_queue.cc), on the steady clock both kvds share.
Events: save (the prefill engine's save_layer arrived), loads (the decode kvd got an engine's
StartLoads), request (the decode kvd starts a WantRequest), wanted (it was written to the peer's
socket), want_in (a WantRequest reached the prefill kvd), want (its checks passed), post (a layer's batch went to the transport), flushed (the
transport completed it: the data landed), notify (its LayerNotice was handed to the transport),
notice (the decode kvd received a LayerNotice and sent LayerReady to its engines). `kvbench pd
--trace` adds the engines' side on its stderr: ewave (the wave's clock starts), esave, eloads (a
decode engine sent StartLoads), einplace (its WaitLayer returned).

  kvbench pd --prewrite --trace 2> t.log      (its own kvds log at debug level to its stderr)
  tools/pd_timeline.py t.log [--window 8]
or with kvds of your own:
  kvd --log-level debug ... > prefill.log 2>&1   (and the decode kvd likewise)
  kvbench pd --prefill-daemon P.sock --decode-daemon D.sock --prewrite [--trace 2> bench.log]
  tools/pd_timeline.py prefill.log decode.log [bench.log] [--window 8]

Times are microseconds from the wave's clock start (ewave) where the engines' trace is given,
else from the wave's first event. Each column is the first (or last) such event of the wave.
"lag" is notice minus flushed for the same (request, layer): how long a landed layer waited
before its engine heard of it. The last line gives each column's median over the waves after
the first (which pays for connecting).
"""
import argparse
import collections
import re
import statistics

LINE = re.compile(r"trace (\d+) (\w+) (\S+) (-?\d+) (\d+)")


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
    for e in events:
        number = re.search(r"(\d+)$", e[2])
        waves[int(number[1]) // args.window if number else 0].append(e)
    columns = [("eloads", "first"), ("loads", "first"), ("request", "first"),
               ("wanted", "first"), ("want_in", "first"), ("want", "first"), ("post", "first"), ("save", "last"),
               ("post", "last"), ("flushed", "last"), ("notice", "last"), ("einplace", "last")]
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
        row = [first(k) if which == "first" else last(k) for k, which in columns]
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
