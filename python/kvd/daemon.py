"""The kvd binary from Python: `python -m kvd.daemon --name n --listen 127.0.0.1:0 --socket
/tmp/n.sock` runs the kvd bundled with the package (or the build tree's), and KvdProcess starts
one as a child for tests and demos and always stops it."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .errors import LibraryNotFoundError, TimeoutError, UnavailableError


def find_binary(name: str = "kvd") -> str:
    """The `name` binary (kvd or kvctl): next to the package (a wheel's kvd/bin), KVD_BINARY's
    folder (for kvd: the file itself), the build tree of this repository, then PATH."""
    here = Path(__file__).resolve().parent
    tried = []
    candidates = [("next to the package", here / "bin" / name)]
    env = os.environ.get("KVD_BINARY")
    if env:
        p = Path(env)
        candidates.append(("KVD_BINARY", p if name == "kvd" and p.is_file() else
                           (p if p.is_dir() else p.parent) / name))
    candidates.append(("the build tree", here.parent.parent / "build" / "bin" / name))
    for where, path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        tried.append(f"{path} ({where})")
    found = shutil.which(name)
    if found:
        return found
    raise LibraryNotFoundError(f"cannot find the {name} binary. Looked at: " + ", ".join(tried) +
                               ", and PATH")


class KvdProcess:
    """A kvd child process: started by the constructor, ready (its ready line read) when the
    constructor returns, stopped by stop() (SIGTERM, then SIGKILL after `grace` seconds), kill()
    or the end of a with block. `address` is its peers' TCP address, `socket` its engine socket."""

    def __init__(self, name: str, socket: str, listen: str = "127.0.0.1:0",
                 transport: str = "auto", offload_bytes: int = 0, args=(), timeout: float = 20.0,
                 log_level: str = "warn", binary: str = None):
        self.name, self.socket = name, str(socket)
        cmd = [binary or find_binary("kvd"), "--name", name, "--listen", listen, "--socket",
               self.socket, "--transport", transport, "--log-level", log_level]
        if offload_bytes:
            cmd += ["--offload-bytes", str(offload_bytes)]
        cmd += [str(a) for a in args]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            line = self._ready_line(timeout)
        except BaseException:
            self.kill()
            raise
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        self.address = fields.get("listen", "")
        self.transport = fields.get("transport", "")

    def _ready_line(self, timeout):
        """kvd's "kvd NAME ready listen=... socket=... transport=..." line on stdout. Lines
        before it (an older kvd logged to stdout too) are passed over, within the deadline."""
        deadline = time.monotonic() + timeout
        out = self.proc.stdout
        buf = b""
        while True:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith(f"kvd {self.name} ready "):
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"kvd {self.name} printed no ready line in {timeout} s "
                                   f"({' '.join(self.cmd)})")
            ready, _, _ = select.select([out], [], [], left)
            if ready:
                chunk = os.read(out.fileno(), 4096)
                if not chunk:
                    code = self.proc.wait(timeout=5)
                    raise UnavailableError(f"kvd {self.name} exited ({code}) before it was "
                                           f"ready: {' '.join(self.cmd)}")
                buf += chunk

    @property
    def pid(self):
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0):
        """SIGTERM, then SIGKILL if it has not exited after `grace` seconds. Returns its exit
        code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    binary = find_binary("kvd")
    os.execv(binary, [binary] + list(argv))


if __name__ == "__main__":
    main()
