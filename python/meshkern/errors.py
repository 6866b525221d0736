"""Exceptions raised for meshkern statuses.

Every failing call raises a subclass of :class:`MeshkernError` carrying ``status`` (the
symbolic name, e.g. ``"MK_ERR_SEAM_MISMATCH"``), ``code`` (its integer value) and
``message`` (``mk_last_error()``). There is one class per status *family* (the header's
groups) and, below it, one class per status named after it (``MK_ERR_SEAM_MISMATCH`` ->
:class:`SeamMismatchError`), so callers catch as broadly or narrowly as they like::

    MeshkernError
      GeneralError            1..5    InvalidArgumentError, OutOfMemoryError, IoError, ...
      ArchitectureError       10..11  UncertifiedArchitectureError, InvalidRangeError
      BoundaryContractError   20..28  HeadOwnsEmbeddingError, SeamMismatchError, ...
        WireError             40..55  WireDecodeError, SchemaVersionError, ...
      ModelFileError          60..71  GgufTruncatedError, GgufMagicError, ...
      DeviceError             80..87
      SeamError               90..96  PeerClosedError, PeerTimeoutError, AuthError, ...
      TextError               100..102 TokenizerError, InvalidUtf8Error, ChatTemplateError

Wire errors (malformed bundle bytes) are boundary-contract errors too.
"""

from __future__ import annotations

from ._lib import STATUS_CODES, STATUS_NAMES, ffi, lib, string


class MeshkernError(Exception):
    """A meshkern call failed: ``status`` name, ``code`` and ``message``."""

    status: str = "MK_ERR_INTERNAL"
    code: int = 4

    def __init__(self, message: str = "", *, status: str | None = None, code: int | None = None):
        if code is not None:
            self.code = code
            self.status = STATUS_NAMES.get(code, status or f"MK_STATUS_{code}")
        elif status is not None:
            self.status = status
            self.code = STATUS_CODES.get(status, self.code)
        self.message = message
        super().__init__(f"{self.status} ({self.code}): {message}" if message else f"{self.status} ({self.code})")


class GeneralError(MeshkernError):
    """Generic failures: invalid argument, out of memory, I/O, internal, unsupported."""


class ArchitectureError(MeshkernError):
    """Architecture registry and roles."""


class BoundaryContractError(MeshkernError):
    """The boundary contract refused an input (roles, seams, sampling)."""


class WireError(BoundaryContractError):
    """Bundle / TailResult bytes or fields refused by validation."""


class ModelFileError(MeshkernError):
    """A GGUF model file is malformed or inconsistent."""


class DeviceError(MeshkernError):
    """Devices, CUDA, cuBLAS, NCCL, MPI."""


class SeamError(MeshkernError):
    """Seams and transports."""


class TextError(MeshkernError):
    """Tokenizer and chat template."""


def _family(code: int) -> type[MeshkernError]:
    if 1 <= code < 10:
        return GeneralError
    if 10 <= code < 20:
        return ArchitectureError
    if 20 <= code < 40:
        return BoundaryContractError
    if 40 <= code < 60:
        return WireError
    if 60 <= code < 80:
        return ModelFileError
    if 80 <= code < 90:
        return DeviceError
    if 90 <= code < 100:
        return SeamError
    if 100 <= code < 110:
        return TextError
    return MeshkernError


def _class_name(status: str) -> str:
    return "".join(w.capitalize() for w in status[len("MK_ERR_"):].split("_")) + "Error"


#: code -> exception class, one per status of the header
STATUS_CLASSES: dict[int, type[MeshkernError]] = {}
for _name, _code in STATUS_CODES.items():
    if _code == 0:
        continue
    _cls = type(_class_name(_name), (_family(_code),), {"status": _name, "code": _code,
                                                        "__doc__": f"Status {_name} ({_code})."})
    _cls.__module__ = __name__
    STATUS_CLASSES[_code] = _cls
    globals()[_cls.__name__] = _cls


def error_for(code: int, message: str | None = None) -> MeshkernError:
    """The exception for a status code; message defaults to mk_last_error()."""
    if message is None:
        message = string(lib.mk_last_error())
    cls = STATUS_CLASSES.get(int(code), MeshkernError)
    return cls(message, code=int(code))


def check(status: int) -> None:
    """Raise the exception of a non-OK status (reads mk_last_error on this thread)."""
    if status != 0:
        raise error_for(status)


def raise_status(status_name: str, message: str) -> None:
    """Raise the exception of a named status with a message (for checks the Python
    layer applies before any C call, e.g. a duck-typed shard's input side)."""
    raise error_for(STATUS_CODES[status_name], message)


__all__ = ["MeshkernError", "GeneralError", "ArchitectureError", "BoundaryContractError", "WireError",
           "ModelFileError", "DeviceError", "SeamError", "TextError", "STATUS_CLASSES", "error_for", "check"] + \
          [c.__name__ for c in STATUS_CLASSES.values()]

del ffi
