import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
if not os.environ.get("KVD_TEST_INSTALLED"):
    sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(HERE))
# The harness drives the connector with its own stand-ins for vLLM's types; KvdConnector's base
# class is vLLM's when vLLM is importable (KVD_VLLM_STANDIN=1 forces kvd's stand-ins).

torch = pytest.importorskip("torch", reason="the vLLM call-sequence harness needs torch")
