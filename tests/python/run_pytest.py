"""Runs one pytest file for ctest: exit 77 (ctest's SKIP_RETURN_CODE) when this interpreter lacks
pytest, numpy or torch, or when pytest collected no tests (its exit code 5); pytest's code
otherwise. Each test runs under a bound (pytest-timeout is not assumed: the tests bound their
own waits, ctest's TIMEOUT bounds the file)."""

import importlib.util
import sys

SKIP = 77


def main(argv):
    missing = [m for m in ("pytest", "numpy", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"SKIP: {sys.executable} lacks {', '.join(missing)} (tools/setup.sh installs "
              "python3-pytest, python3-numpy and python3-torch)")
        return SKIP
    import pytest
    rc = pytest.main(["-q", "-p", "no:cacheprovider", *argv[1:]])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("SKIP: pytest collected no tests")
        return SKIP
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
