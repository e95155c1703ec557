"""`python -m kvd`: prints the package's version, the library and the binaries it found."""

import sys

import kvd
from kvd.daemon import find_binary


def main():
    print(f"kvd package {kvd.__file__}")
    try:
        print(f"library {kvd.library_path()} version {kvd.version()}")
    except kvd.KvdError as e:
        print(e.message)
        return 1
    for name in ("kvd", "kvctl"):
        try:
            print(f"{name} {find_binary(name)}")
        except kvd.KvdError as e:
            print(e.message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
