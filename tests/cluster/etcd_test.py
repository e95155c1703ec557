#!/usr/bin/env python3
"""kvd --etcd: membership in an etcd on a third host of the namespace cluster.

Host 3 runs Debian's etcd; kvds on hosts 1 and 2 register in it with a 3 s lease. Checks:
`kvctl cluster --etcd URL --json` (run on host 1) lists both with their peer addresses; with
etcd's link down, P/D between them still moves every byte (etcd is never on a transfer's path);
a SIGKILLed kvd leaves the list within its lease; a kvd that exits cleanly leaves at once.
Case `names`: transfer params naming the prefill kvd by daemon name (kvbench pd --peer-by-name),
resolved through etcd, across a restart of the prefill kvd on another port and an etcd outage.

usage: etcd_test.py etcd|names --build BUILD_DIR   (exit 0 pass, 1 fail, 77 skip)
"""

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvcluster  # noqa: E402
from kvcluster import Cluster, Skip, kvbench_pd  # noqa: E402

LEASE_S = 3
SMALL = ["--requests", "8", "--window", "8", "--tokens", "256", "--layers", "8"]


def members(c, build, url):
    """{name: record} from kvctl cluster on host 1, or None if etcd did not answer."""
    r = subprocess.run(c.ns(0) + [os.path.join(build, "bin", "kvctl"), "cluster", "--etcd", url,
                                  "--json", "--timeout-ms", "1000"],
                       capture_output=True, text=True, timeout=15)
    if r.returncode != 0:
        return None
    return {m["name"]: m for m in json.loads(r.stdout)}


def wait_for(predicate, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(step)
    return None


def start_etcd(c, build):
    """Debian's etcd on host 3 of `c`; its client URL once it answers."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise Skip("etcd is not installed (Debian's etcd-server; bash tools/setup.sh installs it)")
    url = f"http://{c.address(2)}:2379"
    c.spawn([etcd, "--data-dir", os.path.join(c.dir, "etcd"), "--name", "kvtest",
             "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", "http://127.0.0.1:2380",
             "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
             "--initial-cluster", "kvtest=http://127.0.0.1:2380"],
            host=2, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(c.dir, "etcd.log"), "wb"))
    assert wait_for(lambda: members(c, build, url) is not None, 20), "etcd did not start"
    return url


def case_etcd(build):
    with Cluster(3, build) as c:
        url = start_etcd(c, build)

        args = ["--etcd", url, "--etcd-lease-s", str(LEASE_S), "--heartbeat-ms", "200"]
        p = c.start_kvd(0, "prefill", args=args)
        d = c.start_kvd(1, "decode", args=args)
        both = wait_for(lambda: (m := members(c, build, url)) and {"prefill", "decode"} <= m.keys()
                        and m, 5)
        assert both, f"the kvds did not appear in etcd: {members(c, build, url)}"
        assert both["prefill"]["address"] == p.listen, both
        assert both["decode"]["address"] == d.listen, both
        assert both["prefill"]["transports"] == ["ucx"], both

        # etcd unreachable: transfers go on (static peer addresses), and do not wait for it.
        c.link(2, up=False)
        r = kvbench_pd(build, p, d, SMALL, timeout=60)
        assert r["exit"] == 0 and r["verified"] == r["requests"], f"with etcd down: {r}"
        assert r["guard_bytes_written"] == 0, r
        c.link(2, up=True)
        back = wait_for(lambda: (m := members(c, build, url)) and {"prefill", "decode"} <= m.keys(),
                        LEASE_S + 5)
        assert back, f"the kvds are not listed again after etcd came back: {members(c, build, url)}"

        d.kill()  # SIGKILL: no goodbye; the lease runs out
        killed = time.monotonic()
        gone = wait_for(lambda: (m := members(c, build, url)) is not None and "decode" not in m,
                        LEASE_S + 3)
        gone_s = time.monotonic() - killed
        assert gone, f"decode still listed {gone_s:.1f} s after SIGKILL (lease {LEASE_S} s)"
        assert gone_s <= LEASE_S + 1.5, f"decode left {gone_s:.2f} s after SIGKILL"
        assert "prefill" in members(c, build, url), "prefill left with decode"
        print(f"  SIGKILL -> record gone in {gone_s * 1000:.0f} ms (lease {LEASE_S} s)")

        stopped = time.monotonic()
        assert p.stop() == 0, "prefill did not exit cleanly"
        clean_s = time.monotonic() - stopped
        m = members(c, build, url)
        assert m is not None and "prefill" not in m, f"clean exit left the record: {m}"
        print(f"  SIGTERM -> exit and record gone in {clean_s * 1000:.0f} ms")
        assert clean_s < LEASE_S, f"clean exit took {clean_s:.2f} s"


def expect_verified(r, what):
    assert r["exit"] == 0 and r["verified"] == r["requests"] and r["failed"] == 0, f"{what}: {r}"
    assert r["guard_bytes_written"] == 0, f"{what}: bytes outside the blocks: {r}"


def listed_at(c, build, url, name, address, timeout):
    """Waits until etcd lists `name` at `address`; the members, or None."""
    return wait_for(lambda: (m := members(c, build, url)) and m.get(name, {}).get("address")
                    == address and m, timeout)


def case_names(build):
    """Transfer params that name the prefill kvd by its daemon name, resolved through etcd by
    the decode kvd: a prefill kvd restarted on another port is found again; with etcd
    unreachable, a name already resolved keeps working, static addresses too, and a name that
    must be looked up fails in bounded time, logged."""
    with Cluster(3, build) as c:
        url = start_etcd(c, build)
        args = ["--etcd", url, "--etcd-lease-s", str(LEASE_S)]
        p = c.start_kvd(0, "prefill", args=args)
        # info: the resolver's "resolves to" and "unreachable" lines are what the test reads.
        d = c.start_kvd(1, "decode", args=args + ["--log-level", "info"])
        assert listed_at(c, build, url, "prefill", p.listen, 5), members(c, build, url)

        by_name = SMALL + ["--peer-by-name"]
        expect_verified(kvbench_pd(build, p, d, by_name + ["--tag", "first"]), "by name")
        assert f"peer name prefill resolves to {p.listen}" in read(d.log), "no lookup logged"

        # etcd unreachable: the name resolved before keeps its address; static ones never asked.
        c.link(2, up=False)
        started = time.monotonic()
        expect_verified(kvbench_pd(build, p, d, by_name + ["--tag", "cached"]), "cached name")
        expect_verified(kvbench_pd(build, p, d, SMALL + ["--tag", "static"]), "static address")
        print(f"  etcd down: by name (cached) and by address in {time.monotonic() - started:.2f} s")

        # The prefill kvd restarted on another port while etcd is away: the decode kvd lost its
        # session, forgot the old address, and cannot look the name up: those loads fail, within
        # the resolver's 1 s etcd timeout, not kvbench's own 8 s.
        p.kill()
        p2 = c.start_kvd(0, "prefill", port=p.port + 1, args=args, label="prefill.2")
        one_wave = ["--requests", "8", "--window", "8", "--tokens", "256", "--layers", "8",
                    "--timeout-ms", "8000", "--peer-by-name", "--tag", "unresolved"]
        started = time.monotonic()
        r = kvbench_pd(build, p2, d, one_wave, timeout=60)
        failed_s = time.monotonic() - started
        assert r["exit"] != 0 and r["failed"] == r["requests"], f"etcd down, name unknown: {r}"
        assert failed_s < 6, f"loads of an unresolvable name took {failed_s:.1f} s to fail"
        assert "unreachable" in read(d.log), "the decode kvd did not log etcd's absence"
        why = [x for x in read(d.log).splitlines() if "load of unresolved-req-" in x]
        assert why and "etcd" in why[0], f"the loads failed for another reason: {why[:1]}"
        print(f"  etcd down, name not cached: every load failed, kvbench done in {failed_s:.2f} s")
        print(f"    {why[0][why[0].find('load of'):][:200]}")
        expect_verified(kvbench_pd(build, p2, d, SMALL + ["--tag", "static2"]),
                        "static address to the restarted kvd, etcd down")

        # etcd back: the new kvd registers its new address, and the name finds it.
        c.link(2, up=True)
        assert listed_at(c, build, url, "prefill", p2.listen, LEASE_S + 5), \
            f"the restarted prefill is not listed at {p2.listen}: {members(c, build, url)}"
        r = kvbench_pd(build, p2, d, by_name + ["--tag", "again"])
        expect_verified(r, "by name after the restart")
        assert f"peer name prefill resolves to {p2.listen}" in read(d.log), "no new lookup logged"
        print(f"  restarted prefill on port {p2.port} (was {p.port}) found by name")


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


if __name__ == "__main__":
    sys.exit(kvcluster.main({"etcd": case_etcd, "names": case_names}, sys.argv))
