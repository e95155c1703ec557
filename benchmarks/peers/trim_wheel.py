#!/usr/bin/env python3
"""Trims a peer's wheel to what a GPU-to-GPU transfer needs, so that it travels to the device
machine within the 64 MiB a call may carry (nixl-cu13 1.5.1 is 56 MiB, the Mooncake cuda13
0.3.14 wheel 47 MiB, beside kvd's sources).

nixl:     keeps the nixl_cu13 Python package, the UCX plugin (both copies the wheel ships), the
          UCX transport modules for CUDA and shared memory (cuda, cma, ucm_cuda); drops
          nixl_ep_cu13 (expert parallel, one build per torch version) and every other plugin.
mooncake: keeps mooncake/{__init__.py,engine.pyi,engine.so}; drops the store, EP, PG, master
          and client binaries.
Both: plus the closure of the kept libraries' DT_NEEDED entries inside the wheel. The result is
a zip with the wheel's tree, unpacked on the device with `python3 -m zipfile -e`. For the run
only: never committed.

usage: trim_wheel.py nixl|mooncake WHEEL OUT.zip
"""
import os
import subprocess
import sys
import tempfile
import zipfile


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return [l.split("[")[1].split("]")[0] for l in out.splitlines() if "(NEEDED)" in l]


def main():
    kind, wheel, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        names = {}
        for d, _, files in os.walk(tmp):
            for f in files:
                names.setdefault(f, []).append(os.path.join(d, f))
        keep = set()
        roots = []
        for d, _, files in os.walk(tmp):
            rel = os.path.relpath(d, tmp)
            for f in files:
                p = os.path.join(d, f)
                top = rel.split(os.sep)[0]
                if top.endswith(".dist-info"):
                    keep.add(p)
                elif kind == "nixl":
                    if top == "nixl_cu13":
                        keep.add(p)
                        if f.endswith(".so"):
                            roots.append(p)
                    elif f.startswith(("libnixl", "libserdes", "libstream")) or f == "libplugin_UCX.so":
                        roots.append(p)
                    elif rel.endswith(os.path.join("libs", "ucx")) and f.startswith(
                            ("libuct_cuda.", "libuct_cma.", "libucm_cuda.")):
                        roots.append(p)
                elif kind == "mooncake":
                    if rel == "mooncake" and f in ("__init__.py", "engine.pyi"):
                        keep.add(p)
                    elif rel == "mooncake" and f == "engine.so":
                        roots.append(p)
                else:
                    sys.exit("kind must be nixl or mooncake")
        todo, seen = list(roots), set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            keep.add(p)
            for n in needed(p):
                todo.extend(names.get(n, []))
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(keep):
                z.write(p, os.path.relpath(p, tmp))
    print(f"{out}: {os.path.getsize(out)} bytes, {len(keep)} files")


if __name__ == "__main__":
    main()
