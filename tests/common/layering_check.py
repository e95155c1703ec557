#!/usr/bin/env python3
"""The house rules of the source tree, checked (issue #20; DESIGN.md's layer rule):

- floors: base <- layout <- kernels <- gpu <- transport <- protocol <- daemon <- connector <- tools;
  a product file includes only its own floor and the floors below it (include/kv, the public
  headers, sits beside base);
- a transport backend's folder (transport/{ucx,nccl,cuda_ipc,host_ipc,staged,local}/) is included only by
  its own files and transport/factory.cc; a test of a backend's internals lives in that folder
  (NAME_test.cc, registered under tests/), and tests elsewhere go through transport/transport.h;
- no dynamic_cast outside the backends; no getenv/setenv outside main()s and tests.
Tests (under tests/, or NAME_test.cc anywhere) are no floor's product code: they may include any
floor, tests/support and tools/testing.

usage: layering_check.py SOURCE_DIR   (exit 0 pass, 1 fail, listing every violation)
       layering_check.py --self-test  (the check finds planted violations in a scratch tree)
"""
import pathlib
import re
import sys
import tempfile

FLOORS = ["base", "layout", "kernels", "gpu", "transport", "protocol", "daemon", "connector"]
BACKENDS = ["ucx", "nccl", "cuda_ipc", "host_ipc", "staged", "local"]
MAINS = {"daemon/main.cc", "tools/kvbench/main.cc", "tools/kvctl/main.cc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def is_test(rel):
    return rel.startswith("tests/") or re.search(r"_test\.(cc|cu)$", rel) is not None


def floor_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in FLOORS and not is_test(rel) else None


def check(root):
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
                if not own and rel != "transport/factory.cc":
                    where = " (a test of them belongs in that folder)" if is_test(rel) else ""
                    problems.append(f"{rel}: includes backend internals {target}{where}")
        in_backend = any(rel.startswith(f"transport/{b}/") for b in BACKENDS)
        if "dynamic_cast" in text and not in_backend and not is_test(rel):
            problems.append(f"{rel}: dynamic_cast outside a backend (ask a capability)")
        if re.search(r"\b(getenv|setenv)\s*\(", text) and rel not in MAINS and not is_test(rel):
            problems.append(f"{rel}: reads or sets the environment outside a main()")
    return len(files), sorted(problems)


def self_test():
    """Plants one violation of each rule (and their allowed twins) and expects exactly those."""
    planted = {
        "tests/transport/x_test.cc": '#include "transport/staged/wire.h"\n',
        "transport/staged/wire_test.cc": '#include "transport/staged/wire.h"\n'
                                         '#include "tools/testing/child_process.h"\n',
        "transport/nccl/y_test.cc": '#include "transport/ucx/ucx_context.h"\n',
        "daemon/z.cc": '#include "transport/ucx/ucx_context.h"\n#include "connector/c.h"\n',
        "transport/factory.cc": '#include "transport/ucx/ucx_context.h"\n',
        "gpu/w.cc": "int f() { return getenv(\"X\") != nullptr; }\n",
    }
    expected = [
        "daemon/z.cc: includes connector/c.h, a floor above daemon/",
        "daemon/z.cc: includes backend internals transport/ucx/ucx_context.h",
        "gpu/w.cc: reads or sets the environment outside a main()",
        "tests/transport/x_test.cc: includes backend internals transport/staged/wire.h "
        "(a test of them belongs in that folder)",
        "transport/nccl/y_test.cc: includes backend internals transport/ucx/ucx_context.h "
        "(a test of them belongs in that folder)",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch)
        for rel, text in planted.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        _, problems = check(root)
    if problems != sorted(expected):
        print("self-test: expected\n  " + "\n  ".join(sorted(expected)))
        print("found\n  " + "\n  ".join(problems))
        return 1
    print(f"self-test: the {len(expected)} planted violations were found, and nothing else")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    count, problems = check(pathlib.Path(sys.argv[1]))
    for p in problems:
        print(p)
    print(f"{count} files checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
