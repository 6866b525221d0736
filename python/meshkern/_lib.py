"""Loading libmeshkern through cffi (ABI mode) and turning statuses into exceptions.

The cdef is generated at import time from the public header ``meshkern.h`` shipped
inside the package (copied from ``include/meshkern.h`` when the wheel is built), so
nothing but the public API is bound. The shared library is looked up, in order:

1. ``$MESHKERN_LIB`` (a path to ``libmeshkern.so``);
2. the copy bundled in the wheel (``meshkern/_lib/libmeshkern.so``);
3. ``pkg-config --variable=libdir meshkern`` (an installed library);
4. the dynamic loader's search path (``libmeshkern.so.0``).

cffi releases the GIL around every C call (both ABI and API mode), so forward passes,
seam waits and generation run while other Python threads continue.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import ctypes

import cffi

from ._cdef import header_to_cdef

_HERE = Path(__file__).resolve().parent


def _header_path() -> Path:
    for p in (_HERE / "meshkern.h", _HERE.parent.parent / "include" / "meshkern.h"):
        if p.is_file():
            return p
    raise ImportError("meshkern: the public header meshkern.h is not shipped with the package")


def _library_candidates() -> list[str]:
    out = []
    env = os.environ.get("MESHKERN_LIB")
    if env:
        out.append(env)
    bundled = _HERE / "_lib" / "libmeshkern.so"
    if bundled.exists():
        out.append(str(bundled))
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "meshkern"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        if libdir:
            out.append(os.path.join(libdir, "libmeshkern.so"))
    except (OSError, subprocess.SubprocessError):
        pass
    out.append("libmeshkern.so.0")
    return out


HEADER_TEXT = _header_path().read_text()
CDEF, DEFINES = header_to_cdef(HEADER_TEXT)

ffi = cffi.FFI()
ffi.cdef(CDEF)


_PINNED: list = []


def _load():
    errors = []
    for cand in _library_candidates():
        try:
            # ctypes never dlcloses: its handle keeps the library mapped through interpreter
            # shutdown, when cffi's handle may go before the last ffi.gc destructor runs.
            _PINNED.append(ctypes.CDLL(cand))
            return ffi.dlopen(cand), cand
        except OSError as e:  # try the next place
            errors.append(f"{cand}: {e}")
    raise ImportError("meshkern: cannot load libmeshkern (set MESHKERN_LIB):\n  " + "\n  ".join(errors))


lib, LIBRARY_PATH = _load()

# ------------------------------------------------------------------ statuses ----

#: status name -> code, parsed from the header's mk_status enum
STATUS_CODES: dict[str, int] = {
    m.group(1): int(m.group(2))
    for m in re.finditer(r"\b(MK_(?:OK|ERR_\w+))\s*=\s*(\d+)", HEADER_TEXT)
}
STATUS_NAMES: dict[int, str] = {v: k for k, v in STATUS_CODES.items()}


def string(p) -> str:
    """A C string (const char *) as str; '' for NULL."""
    if p == ffi.NULL:
        return ""
    return ffi.string(p).decode("utf-8", "replace")
