#!/usr/bin/env python3
"""Per-wave timeline of a `kvbench pd` run from the two kvds' debug logs.

kvd at --log-level debug writes one "trace <us> <event> <request> <layer> <bytes>" line per step of a
transfer (daemon/transfers.cc), on the steady clock both kvds share. Events: save (the prefill
engine's save_layer arrived), want (the decode kvd's WantRequest arrived), post (a layer's batch
went to the transport), flushed (the transport completed it: the data landed), notify (its
LayerNotice was handed to the transport), request (decode kvd sent WantRequest), notice (the
decode kvd received a LayerNotice and sent LayerReady to its engines).

  kvd --log-level debug ... > prefill.log 2>&1   (and the decode kvd likewise)
  kvbench pd --prefill-daemon P.sock --decode-daemon D.sock --prewrite
  tools/pd_timeline.py prefill.log decode.log [--window 8]

Times are microseconds from the wave's first event. "lag" is notice minus flushed for the same
(request, layer): how long a landed layer waited before its engine heard of it.
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
    print("wave  first request  last save  first want  first post  last post  last flushed  "
          "last notice  batches  "
          "post->flushed p50/max  lag p50/max  data GB/s (first post..last flushed)")
    for w, es in sorted(waves.items()):
        t0 = es[0][0]
        at = collections.defaultdict(dict)
        posted = 0
        for t, kind, request, layer, size in es:
            at[kind].setdefault((request, layer), t - t0)
            posted += size
        first = lambda k: min(at[k].values(), default=-1)
        last = lambda k: max(at[k].values(), default=-1)
        latency = sorted(at["flushed"][k] - at["post"][k] for k in at["flushed"] if k in at["post"])
        lag = sorted(at["notice"][k] - at["flushed"][k] for k in at["notice"] if k in at["flushed"])
        span = max(last("flushed") - first("post"), 1)
        gbps = posted / span / 1e3
        p50 = lambda v: int(statistics.median(v)) if v else -1
        print(f"{w:4}  {first('request'):13}  {last('save'):9}  {first('want'):10}  "
              f"{first('post'):10}  {last('post'):9}  "
              f"{last('flushed'):12}  {last('notice'):11}  {len(latency):7}  "
              f"{p50(latency):10}/{max(latency, default=-1):<10}  {p50(lag):5}/{max(lag, default=-1):<6}  "
              f"{gbps:.2f}")


if __name__ == "__main__":
    main()
