import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The in-tree package, unless the run points at an installed one (KVD_TEST_INSTALLED=1).
if not os.environ.get("KVD_TEST_INSTALLED"):
    sys.path.insert(0, str(REPO / "python"))

torch = pytest.importorskip("torch")


def pytest_report_header(config):
    import kvd
    try:
        lib = kvd.library_path()
    except kvd.KvdError as e:
        lib = f"not found ({e.message.splitlines()[0]})"
    return f"kvd package: {Path(kvd.__file__).parent}, library: {lib}"
