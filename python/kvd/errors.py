"""kvd's errors: one exception per C error code (kv_connector.h's KV_* values)."""

from __future__ import annotations

# The C API's codes (KV_OK .. KV_INTERNAL), equal to kv::Code.
OK = 0
INVALID_ARGUMENT = 1
OUT_OF_RANGE = 2
INCOMPATIBLE = 3
NOT_FOUND = 4
ALREADY_EXISTS = 5
RESOURCE_EXHAUSTED = 6
TIMEOUT = 7
UNAVAILABLE = 8
ABORTED = 9
UNSUPPORTED = 10
IO_ERROR = 11
INTERNAL = 12

CODE_NAMES = {
    OK: "ok", INVALID_ARGUMENT: "invalid_argument", OUT_OF_RANGE: "out_of_range",
    INCOMPATIBLE: "incompatible", NOT_FOUND: "not_found", ALREADY_EXISTS: "already_exists",
    RESOURCE_EXHAUSTED: "resource_exhausted", TIMEOUT: "timeout", UNAVAILABLE: "unavailable",
    ABORTED: "aborted", UNSUPPORTED: "unsupported", IO_ERROR: "io_error", INTERNAL: "internal",
}


class KvdError(Exception):
    """An error of kvd or of this package. `code` is the C API's code (see CODE_NAMES),
    `message` the line naming what was wrong."""

    code = INTERNAL

    def __init__(self, message: str, code: int | None = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{CODE_NAMES.get(self.code, 'unknown')}: {message}")

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, "unknown")


class InvalidArgumentError(KvdError, ValueError):
    code = INVALID_ARGUMENT


class OutOfRangeError(KvdError, IndexError):
    code = OUT_OF_RANGE


class IncompatibleError(KvdError):
    code = INCOMPATIBLE


class NotFoundError(KvdError, LookupError):
    code = NOT_FOUND


class AlreadyExistsError(KvdError):
    code = ALREADY_EXISTS


class ResourceExhaustedError(KvdError):
    code = RESOURCE_EXHAUSTED


class TimeoutError(KvdError, TimeoutError):  # noqa: A001 - kvd.TimeoutError is also a builtin one
    code = TIMEOUT


class UnavailableError(KvdError, ConnectionError):
    code = UNAVAILABLE


class AbortedError(KvdError):
    code = ABORTED


class UnsupportedError(KvdError):
    code = UNSUPPORTED


class IoError(KvdError, OSError):
    code = IO_ERROR


class InternalError(KvdError):
    code = INTERNAL


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, OutOfRangeError, IncompatibleError, NotFoundError, AlreadyExistsError,
    ResourceExhaustedError, TimeoutError, UnavailableError, AbortedError, UnsupportedError,
    IoError, InternalError)}


def error_for(code: int, message: str) -> KvdError:
    """The exception for a C code: its subclass, or KvdError itself for a code this package does
    not know."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return KvdError(message, code)
    return cls(message)


class LibraryNotFoundError(KvdError, ImportError):
    """libkvconnector.so is not where the package looked; the message names every place."""
    code = UNAVAILABLE


def invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message)
