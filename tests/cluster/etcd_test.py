#!/usr/bin/env python3
"""kvd --etcd: membership in an etcd on a third host of the namespace cluster.

Host 3 runs Debian's etcd; kvds on hosts 1 and 2 register in it with a 3 s lease. Checks:
`kvctl cluster --etcd URL --json` (run on host 1) lists both with their peer addresses; with
etcd's link down, P/D between them still moves every byte (etcd is never on a transfer's path);
a SIGKILLed kvd leaves the list within its lease; a kvd that exits cleanly leaves at once.

usage: etcd_test.py etcd --build BUILD_DIR   (exit 0 pass, 1 fail, 77 skip)
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


def case_etcd(build):
    etcd = shutil.which("etcd")
    if etcd is None:
        raise Skip("etcd is not installed (Debian's etcd-server; bash tools/setup.sh installs it)")
    with Cluster(3, build) as c:
        host = c.address(2)
        url = f"http://{host}:2379"
        c.spawn([etcd, "--data-dir", os.path.join(c.dir, "etcd"), "--name", "kvtest",
                 "--listen-client-urls", url, "--advertise-client-urls", url,
                 "--listen-peer-urls", "http://127.0.0.1:2380",
                 "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                 "--initial-cluster", "kvtest=http://127.0.0.1:2380"],
                host=2, stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(c.dir, "etcd.log"), "wb"))
        assert wait_for(lambda: members(c, build, url) is not None, 20), "etcd did not start"

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


if __name__ == "__main__":
    sys.exit(kvcluster.main({"etcd": case_etcd}, sys.argv))
