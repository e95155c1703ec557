#!/usr/bin/env python3
"""The house rules of the source tree, checked (issue #20; DESIGN.md's layer rule):

- floors: base <- layout <- kernels <- gpu <- transport <- protocol <- daemon <- connector <- tools;
  a product file includes only its own floor and the floors below it (include/kv, the public
  headers, sits beside base);
- a transport backend's folder (transport/{ucx,nccl,cuda_ipc,staged,local}/) is included only by
  its own files and transport/factory.cc (tests of a backend's internals may include them);
- no dynamic_cast outside the backends; no getenv/setenv outside main()s and tests.

usage: layering_check.py SOURCE_DIR   (exit 0 pass, 1 fail, listing every violation)
"""
import pathlib
import re
import sys

FLOORS = ["base", "layout", "kernels", "gpu", "transport", "protocol", "daemon", "connector"]
BACKENDS = ["ucx", "nccl", "cuda_ipc", "staged", "local"]
MAINS = {"daemon/main.cc", "tools/kvbench/main.cc", "tools/kvctl/main.cc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def floor_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in FLOORS else None


def main():
    root = pathlib.Path(sys.argv[1])
    problems = []
    files = [p for p in root.rglob("*") if p.suffix in (".h", ".cc", ".cu", ".cuh")]
    for path in files:
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build", ".")) or "/build" in rel:
            continue
        text = path.read_text(errors="replace")
        floor = floor_of(rel)
        for target in INCLUDE.findall(text):
            parts = target.split("/")
            to = parts[0]
            if floor and to in FLOORS and FLOORS.index(to) > FLOORS.index(floor):
                problems.append(f"{rel}: includes {target}, a floor above {floor}/")
            if floor and to == "tools":
                problems.append(f"{rel}: product code includes {target}")
            if to == "transport" and len(parts) > 2 and parts[1] in BACKENDS:
                own = rel.startswith(f"transport/{parts[1]}/")
                if not own and rel != "transport/factory.cc" and not rel.startswith("tests/"):
                    problems.append(f"{rel}: includes backend internals {target}")
        in_backend = any(rel.startswith(f"transport/{b}/") for b in BACKENDS)
        if "dynamic_cast" in text and not in_backend and not rel.startswith("tests/"):
            problems.append(f"{rel}: dynamic_cast outside a backend (ask a capability)")
        if re.search(r"\b(getenv|setenv)\s*\(", text) and rel not in MAINS \
                and not rel.startswith("tests/"):
            problems.append(f"{rel}: reads or sets the environment outside a main()")
    for p in sorted(problems):
        print(p)
    print(f"{len(files)} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
