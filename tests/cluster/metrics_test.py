#!/usr/bin/env python3
"""kvd --metrics-listen: /metrics scraped with curl during a P/D run, checked with promtool.

Two kvds on loopback (no namespaces needed, so this runs without root) move a `kvbench pd` run;
/metrics of both is scraped while it moves and after. Checks: promtool accepts every scrape; a
scrape answers fast while transfers run; counters never go down between scrapes; after the run
the per-peer transfer and byte counters and the histograms' counts match what kvbench verified;
an unknown path is a 404.

usage: metrics_test.py metrics --build BUILD_DIR   (exit 0 pass, 1 fail, 77 skip)
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvcluster  # noqa: E402
from kvcluster import Kvd, Skip, kvbench_pd, parse_pd, wait_ready  # noqa: E402

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def start_local_kvd(build, directory, name):
    """A kvd on 127.0.0.1 with /metrics on a free port, learnt from its log line."""
    log_path = os.path.join(directory, f"{name}.log")
    # kvd logs to stderr, its ready line goes to stdout: one pipe, read in order.
    proc = subprocess.Popen(
        [os.path.join(build, "bin", "kvd"), "--name", name, "--listen", "127.0.0.1:0",
         "--socket", os.path.join(directory, f"{name}.sock"), "--transport", "ucx",
         "--log-level", "info", "--metrics-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        m, lines = wait_ready(proc, 20)
        assert m, f"kvd {name} did not start: {lines}"
        kvcluster.drain_to(proc, log_path)
        # kvd logs (before its ready line) where /metrics is: port 0 picked it.
        url = next((u for x in lines for u in re.findall(r"metrics on (http://\S+/metrics)", x)),
                   None)
        assert url, f"kvd {name} logged no metrics address: {lines}"
    except BaseException:
        proc.kill()  # not yet in the caller's list: it would outlive the test
        proc.wait(timeout=10)
        raise
    kvd = Kvd(proc, name, m.group(1), m.group(2), log_path)
    kvd.metrics_url = url
    return kvd


def scrape(kvd, path=None):
    """(text, seconds) of one curl of /metrics; curl itself is bounded by --max-time."""
    url = kvd.metrics_url if path is None else kvd.metrics_url.rsplit("/", 1)[0] + path
    t = time.monotonic()
    r = subprocess.run(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}", url],
                       capture_output=True, text=True, timeout=10)
    elapsed = time.monotonic() - t
    assert r.returncode == 0, f"curl {url}: {r.stderr}"
    body, _, code = r.stdout.rpartition("\n")
    return body, int(code), elapsed


def parse(text):
    """{(name, labels): value} of the exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        assert m, f"not a sample line: {line!r}"
        samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return samples


def promtool(text):
    """`promtool check metrics` of the text: lint and format errors fail the test."""
    tool = shutil.which("promtool")
    if tool is None:
        print("  promtool not installed (Debian's prometheus package): format check skipped")
        return
    r = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}"


def value(samples, metric, **labels):
    total, found = 0.0, False
    for (n, l), v in samples.items():
        if n != metric:
            continue
        if all(f'{k}="{want}"' in l for k, want in labels.items()):
            total += v
            found = True
    assert found, f"no sample {metric} {labels}"
    return total


def check_monotonic(before, after):
    for key, v in before.items():
        name = key[0]
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
            assert after.get(key, -1) >= v, f"counter {key} went down: {v} -> {after.get(key)}"


def case_metrics(build):
    if shutil.which("curl") is None:
        raise Skip("curl is not installed (bash tools/setup.sh installs it)")
    directory = tempfile.mkdtemp(prefix="kvmetrics-")
    kvds = []
    bench = None
    try:
        p = start_local_kvd(build, directory, "prefill")
        kvds.append(p)
        d = start_local_kvd(build, directory, "decode")
        kvds.append(d)
        body, code, _ = scrape(p)
        assert code == 200, code
        promtool(body)
        first = {k: parse(scrape(k)[0]) for k in (p, d)}
        assert value(first[p], "kvd_info", name="prefill") == 1

        requests = 24
        args = ["--requests", str(requests), "--window", "8", "--tokens", "256", "--layers", "8",
                "--layer-us", "40000"]
        bench = kvbench_pd(build, p, d, args, background=True)
        # Scrapes while it moves: each must answer fast and parse.
        during, slowest = [], 0.0
        while bench.poll() is None and len(during) < 40:
            for k in (p, d):
                text, code, took = scrape(k)
                assert code == 200
                slowest = max(slowest, took)
                during.append((k, parse(text)))
            time.sleep(0.05)
        out, err = bench.communicate(timeout=120)
        result = parse_pd(bench.returncode, out, err)
        assert result["exit"] == 0 and result["verified"] == requests, result
        assert len(during) >= 4, "the run ended before two rounds of scrapes"
        # Bounded: kvd waits at most 1 s for the io thread's snapshot (metrics_hooks.cc); the
        # rest is slack for curl on a loaded 2-core machine.
        assert slowest < 2.0, f"a scrape during the run took {slowest:.3f} s"
        promtool(scrape(p)[0])
        promtool(scrape(d)[0])

        last = {k: parse(scrape(k)[0]) for k in (p, d)}
        previous = dict(first)
        for k, s in during + [(p, last[p]), (d, last[d])]:
            check_monotonic(previous[k], s)
            previous[k] = s
        # Every verified request was counted, under the peer's name, on both sides.
        src = last[p]
        dst = last[d]
        assert value(src, "kvd_transfers_total", peer="decode", role="source",
                     outcome="done") == requests
        assert value(dst, "kvd_transfers_total", peer="prefill", role="destination",
                     outcome="done") == requests
        assert value(dst, "kvd_transfer_bytes_total", peer="prefill",
                     role="destination") == result["bytes"], (dst, result["bytes"])
        assert value(src, "kvd_transfer_bytes_total", peer="decode",
                     role="source") == result["bytes"]
        assert value(src, "kvd_request_seconds_count", role="source") == requests
        assert value(dst, "kvd_request_seconds_count", role="destination") == requests
        # One layer copy per request and layer (TP 1 -> 1) landed and was timed.
        assert value(src, "kvd_layer_seconds_count") == requests * 8
        assert value(src, "kvd_transfers_failed_total") == 0
        assert value(src, "kvd_bytes_sent_total") >= result["bytes"]
        print(f"  {len(during)} scrapes during the run, slowest {slowest * 1000:.1f} ms")

        body, code, _ = scrape(p, "/nothing")
        assert code == 404, code
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        for k in kvds:
            k.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(kvcluster.main({"metrics": case_metrics}, sys.argv))
