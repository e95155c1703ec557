"""Test hosts in network namespaces: a switch, hosts wired to it, a kvd per host.

Layout of one Cluster (every name carries this run's tag, so parallel ctest runs never collide):

    namespace <tag>-sw     a bridge "br0" and the switch end "p<i>" of every host's veth pair
    namespace <tag>-h<i>   "eth0" (the host end), address 10.77.0.<i>/24, and "lo"

The bridge lives in its own namespace, not in the machine's, so a run touches nothing outside the
namespaces it created and two runs may use the same addresses. Teardown (Cluster.close, also on
an exception, SIGTERM or SIGINT) kills every process started in the run's namespaces and deletes
them, which deletes the veths and the bridge. A run killed with SIGKILL (ctest's timeout) leaves
its namespaces behind: the next run deletes every namespace whose tag names a process that is gone.

Only the Python standard library is used. Root (CAP_SYS_ADMIN, CAP_NET_ADMIN) is needed; without
it, or where the kernel forbids namespaces, Skip is raised and the test exits SKIP_CODE.
"""

import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP_CODE = 77  # ctest SKIP_RETURN_CODE of every cluster test
SUBNET = "10.77.0"
TAG_RE = re.compile(r"^kvc(\d+)x[0-9a-f]+-")


class Skip(Exception):
    """The machine cannot run this test (no root, no namespaces, no netem...)."""


def run(cmd, check=True, timeout=30, **kw):
    """Runs a short command (ip, tc); every call is bounded."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _kill_namespace_pids(ns):
    """SIGKILLs what still runs in `ns`: only processes this run (or a dead run) started there."""
    r = run(["ip", "netns", "pids", ns], check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def reap_stale():
    """Deletes namespaces left by runs that died without their teardown (SIGKILL)."""
    r = run(["ip", "netns", "list"], check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = TAG_RE.match(name)
        if not m or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        # Only old ones: a run in another pid namespace (a container sharing /run/netns) has a
        # pid we cannot see, and no cluster test lives for 15 minutes.
        try:
            if time.time() - os.stat(f"/run/netns/{name}").st_mtime < 900:
                continue
        except OSError:
            continue
        _kill_namespace_pids(name)
        run(["ip", "netns", "del", name], check=False)


def check_capable():
    """Raises Skip unless namespaces, veths and bridges can be made here."""
    if shutil.which("ip") is None:
        raise Skip("iproute2's `ip` is not installed (bash tools/setup.sh installs it)")
    if os.geteuid() != 0:
        raise Skip("network namespaces need root (run the cluster tests as root)")
    probe = f"kvc{os.getpid()}x{secrets.token_hex(3)}-probe"
    r = run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        raise Skip(f"this machine forbids network namespaces: {r.stderr.strip()}")
    try:
        # Namespaces alone are not enough: some sandboxes refuse veths or bridges in them.
        for what in (["type", "veth"], ["type", "bridge"]):
            r = run(["ip", "-n", probe, "link", "add", "probe0"] + what, check=False)
            if r.returncode != 0:
                raise Skip(f"this machine forbids `ip link add {what[1]}` in a namespace: "
                           f"{r.stderr.strip()}")
            run(["ip", "-n", probe, "link", "del", "probe0"], check=False)
    finally:
        run(["ip", "netns", "del", probe], check=False)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class Kvd:
    """One kvd process in a host namespace; the ready line names its address and socket."""

    def __init__(self, proc, name, listen, socket, log):
        self.proc, self.name, self.listen, self.socket, self.log = proc, name, listen, socket, log

    @property
    def port(self):
        return int(self.listen.rsplit(":", 1)[1])

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout=10):
        """SIGTERM (kvd drains and exits 0), then SIGKILL if it does not exit in time."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


class Cluster:
    """`hosts` hosts on one bridge. Use as a context manager; close() is idempotent."""

    def __init__(self, hosts, build_dir):
        self.build = os.path.abspath(build_dir)
        self.tag = f"kvc{os.getpid()}x{secrets.token_hex(3)}"
        self.switch = f"{self.tag}-sw"
        self.hosts = [f"{self.tag}-h{i + 1}" for i in range(hosts)]
        self.dir = None  # made in __enter__, once the machine is known to allow namespaces
        self.kvds = []
        self.children = []  # other processes we started (kvbench, etcd, ...)
        self._made = []
        self._closed = False

    def address(self, host):
        """10.77.0.<host+1>: host i (0-based) of this cluster."""
        return f"{SUBNET}.{host + 1}"

    def __enter__(self):
        check_capable()
        reap_stale()
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/tmp")
        # Teardown also on SIGTERM/SIGINT (ctest --stop-on-failure, ^C): raise into the finally.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _interrupt)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:  # the test failed: what the daemons said, before it is deleted
            for k in self.kvds:
                print(f"--- {os.path.basename(k.log)} (last lines) ---")
                with open(k.log, errors="replace") as f:
                    print("".join(f.readlines()[-25:]), end="")
        self.close()
        return False

    def ns(self, host):
        return ["ip", "netns", "exec", self.hosts[host]]

    def _build(self):
        run(["ip", "netns", "add", self.switch])
        self._made.append(self.switch)
        sw = ["ip", "-n", self.switch]
        run(sw + ["link", "add", "br0", "type", "bridge"])
        run(sw + ["link", "set", "br0", "up"])
        for i, host in enumerate(self.hosts):
            run(["ip", "netns", "add", host])
            self._made.append(host)
            # Created in the switch's namespace with its peer straight in the host's: the
            # machine's own namespace never holds an interface of ours, even for a moment.
            run(sw + ["link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", host])
            run(sw + ["link", "set", f"p{i}", "master", "br0", "up"])
            h = ["ip", "-n", host]
            run(h + ["addr", "add", f"{self.address(i)}/24", "dev", "eth0"])
            run(h + ["link", "set", "eth0", "up"])
            run(h + ["link", "set", "lo", "up"])

    def link(self, host, up):
        """Takes host's link up or down at the switch: the host's eth0 loses its carrier."""
        run(["ip", "-n", self.switch, "link", "set", f"p{host}", "up" if up else "down"])

    def rate_limit(self, host, rate):
        """Limits both directions of host's link to `rate` (tc tbf, e.g. "16mbit")."""
        for ns, dev in ((self.hosts[host], "eth0"), (self.switch, f"p{host}")):
            run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", rate, "burst", "64kb", "latency", "50ms"])

    def rx_bytes(self, host):
        """Bytes host's eth0 has received: what crossed its veth from the switch."""
        r = run(self.ns(host) + ["cat", "/sys/class/net/eth0/statistics/rx_bytes"])
        return int(r.stdout)

    def netem(self, host, spec):
        """Applies `tc qdisc ... netem SPEC` to both directions of host's link. Skip if the kernel
        lacks sch_netem (some VM kernels ship without it)."""
        for ns, dev in ((self.hosts[host], "eth0"), (self.switch, f"p{host}")):
            r = run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                     "netem"] + spec.split(), check=False)
            if r.returncode != 0:
                if "unknown" in r.stderr.lower() or "not found" in r.stderr.lower():
                    raise Skip(f"tc netem {spec}: {r.stderr.strip()} ({netem_absence()})")
                raise RuntimeError(f"tc netem {spec} on {dev}: {r.stderr.strip()}")

    def secret_file(self):
        """The cluster's shared peer secret: 32 random bytes in a 0600 file of the run's folder."""
        path = os.path.join(self.dir, "peer.secret")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        return path

    def start_kvd(self, host, name, port=0, args=(), env=None, ready_timeout=20, label=None):
        """Starts build/bin/kvd in host's namespace, listening on its address, with UCX forced
        onto the network (tcp over eth0: no shared memory, no loopback). `label` (default: name)
        names its socket and log, so a restarted daemon keeps its name with fresh files."""
        label = label or name
        socket = os.path.join(self.dir, f"{label}.sock")
        log = open(os.path.join(self.dir, f"{label}.log"), "ab")
        e = dict(os.environ)
        # UCX logs to stdout, buffered: a fatal error's message would die in the buffer with the process.
        e.update({"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0", "UCX_WARN_UNUSED_ENV_VARS": "n",
                  "UCX_LOG_FILE": "stderr"})
        if env:
            e.update(env)
        # Peers off loopback must prove a shared secret (SECURITY.md), and transfer tokens are
        # then required (--transfer-token auto): kvbench pd's prefill engines fix each request's
        # token before their first save and its decode engines present it, so its loads that
        # start before the prefill finished still stream.
        cmd = self.ns(host) + [
            os.path.join(self.build, "bin", "kvd"), "--name", name,
            "--listen", f"{self.address(host)}:{port}", "--socket", socket,
            "--transport", "ucx", "--log-level", "warn",
            "--auth-secret-file", self.secret_file()] + list(args)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=e)
        log.close()
        self.children.append(proc)
        m, lines = wait_ready(proc, ready_timeout)
        with open(os.path.join(self.dir, f"{label}.log"), "a") as f:
            f.write("".join(x + "\n" for x in lines))
        if not m:
            proc.kill()
            raise RuntimeError(f"kvd {name} did not get ready: {lines}; log: {self.log(label)}")
        drain_to(proc, os.path.join(self.dir, f"{label}.log"))
        kvd = Kvd(proc, name, m.group(1), m.group(2), os.path.join(self.dir, f"{label}.log"))
        self.kvds.append(kvd)
        return kvd

    def log(self, name):
        try:
            with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def spawn(self, cmd, host=None, **kw):
        """Starts a helper process (in host's namespace, or here), torn down with the cluster."""
        full = (self.ns(host) if host is not None else []) + list(cmd)
        proc = subprocess.Popen(full, **kw)
        self.children.append(proc)
        return proc

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in self.children:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in self.children:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for ns in reversed(self._made):
            _kill_namespace_pids(ns)
            run(["ip", "netns", "del", ns], check=False)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def netem_absence():
    """Why `tc qdisc add ... netem` is refused here, as precisely as the kernel tells: its build
    config (/proc/config.gz, where the kernel exposes it) and whether it loads modules at all."""
    release = os.uname().release
    built = None
    try:
        import gzip
        with gzip.open("/proc/config.gz", "rt") as f:
            for line in f:
                if line.startswith("CONFIG_NET_SCH_NETEM=") or "CONFIG_NET_SCH_NETEM is not" in line:
                    built = line.strip()
    except OSError:
        pass
    modules = os.path.isdir(f"/lib/modules/{release}")
    if built is not None and built.endswith("=y"):
        return f"kernel {release} has sch_netem built in, yet refused it"
    if built is not None and built.endswith("=m"):
        return (f"kernel {release} builds sch_netem as a module, not loaded"
                + ("" if modules else f", and /lib/modules/{release} does not exist to load it"))
    if built is not None:
        return (f"kernel {release} was built without sch_netem ({built} in /proc/config.gz)"
                + ("" if modules else f"; it has no /lib/modules/{release} either"))
    return (f"kernel {release} has no sch_netem loaded"
            + ("" if modules else f" and no /lib/modules/{release} to load it from"))


def drain_to(proc, path):
    """Copies the rest of proc's stdout into `path` on a thread. spdlog and UCX write there too,
    and a pipe nobody reads fills up and blocks kvd mid-transfer."""
    def copy():
        with open(path, "ab") as f:
            for chunk in iter(lambda: os.read(proc.stdout.fileno(), 65536), b""):
                f.write(chunk)
                f.flush()
    threading.Thread(target=copy, daemon=True).start()


def wait_ready(proc, timeout):
    """(match of kvd's ready line, every line read). spdlog and UCX write to stdout too, so
    other lines may come first: they are returned for the caller's log."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = _read_line(proc, max(0.0, deadline - time.monotonic()))
        if line is None:
            break
        lines.append(line)
        m = re.search(r"ready listen=(\S+) socket=(\S+)", line)
        if m:
            return m, lines
    return None, lines


def _read_line(proc, timeout):
    """One line of proc's stdout within `timeout` seconds (None on timeout or exit)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        if chunk == b"\n":
            return buf.decode(errors="replace")
        buf += chunk
    return None


def kvbench_pd(build, prefill, decode, args=(), timeout=120, background=False):
    """`kvbench pd` against the two kvds (their unix sockets: a path socket is reachable from
    every network namespace); `decode` may be a list of kvds, decode rank r behind the
    r % n-th. Returns the parsed JSON, or the Popen when background."""
    decodes = decode if isinstance(decode, (list, tuple)) else [decode]
    cmd = [os.path.join(build, "bin", "kvbench"), "pd", "--prefill-daemon", prefill.socket,
           "--decode-daemon", ",".join(d.socket for d in decodes), "--no-ceiling",
           "--json"] + list(args)
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return parse_pd(r.returncode, r.stdout, r.stderr)


def parse_pd(rc, out, err):
    for line in out.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            result["exit"] = rc
            result["stderr"] = err[-2000:]
            return result
    raise RuntimeError(f"kvbench pd printed no result (exit {rc}): {err[-2000:]}")


def kvd_status(build, kvd, timeout=10):
    """`kvctl status --json` of a kvd (None when it does not answer)."""
    r = subprocess.run([os.path.join(build, "bin", "kvctl"), "status", "--daemon", kvd.socket,
                        "--json", "--timeout-ms", "2000"], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def main(cases, argv):
    """Runs the case named argv[1] with --build DIR; exit 0 pass, 1 fail, SKIP_CODE skip."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(cases))
    ap.add_argument("--build", default="build")
    a = ap.parse_args(argv[1:])
    try:
        cases[a.case](os.path.abspath(a.build))
    except Skip as s:
        print(f"SKIP: {s}")
        return SKIP_CODE
    except AssertionError as e:
        print(f"FAIL: {e}")
        return 1
    print("PASS")
    return 0
