"""kvarena.Error and one subclass per status code.

Every failure of a kvarena call raises the subclass of its code, with the daemon's message
and ``.code`` (a ``StatusCode``). Subclasses also derive from the built-in exception a
Python caller would expect: ``InvalidArgument`` is a ``ValueError``, ``NotFound`` a
``LookupError``, ``DeadlineExceeded`` a ``TimeoutError``, ``Unavailable`` a
``ConnectionError``, ``PermissionDenied`` and ``Unauthenticated`` ``PermissionError``s.
"""

import enum


class StatusCode(enum.IntEnum):
    """absl::StatusCode / grpc::StatusCode values."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class Error(Exception):
    """A kvarena call failed: ``.code`` says how, ``.message`` is the daemon's text."""

    code = StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = StatusCode(code)

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class Cancelled(Error):
    code = StatusCode.CANCELLED


class Unknown(Error):
    code = StatusCode.UNKNOWN


class InvalidArgument(Error, ValueError):
    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error, TimeoutError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFound(Error, LookupError):
    code = StatusCode.NOT_FOUND


class AlreadyExists(Error):
    code = StatusCode.ALREADY_EXISTS


class PermissionDenied(Error, PermissionError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhausted(Error):
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = StatusCode.FAILED_PRECONDITION


class Aborted(Error):
    code = StatusCode.ABORTED


class OutOfRange(Error, IndexError):
    code = StatusCode.OUT_OF_RANGE


class Unimplemented(Error, NotImplementedError):
    code = StatusCode.UNIMPLEMENTED


class Internal(Error):
    code = StatusCode.INTERNAL


class Unavailable(Error, ConnectionError):
    code = StatusCode.UNAVAILABLE


class DataLoss(Error):
    code = StatusCode.DATA_LOSS


class Unauthenticated(Error, PermissionError):
    code = StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in Error.__subclasses__()}


def error_for(code, message):
    """The exception instance for a status code (called by the extension)."""
    code = StatusCode(code) if code in StatusCode._value2member_map_ else StatusCode.UNKNOWN
    return _BY_CODE.get(code, Error)(message, code)
