"""Turn include/meshkern.h into a cffi cdef (the binding is generated from the public
header, never written by hand, so it cannot drift from it)."""

from __future__ import annotations

import re


def header_to_cdef(text: str) -> tuple[str, dict[str, int]]:
    """Return (cdef source, integer #defines) for the public header text."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)          # block comments
    text = re.sub(r"//[^\n]*", " ", text)                          # line comments
    # drop the extern "C" wrapper (inside #ifdef __cplusplus)
    text = re.sub(r"#ifdef __cplusplus.*?#endif", " ", text, flags=re.S)
    # the MK_API definition block
    text = re.sub(r"#if defined\(_WIN32\).*?#endif", " ", text, flags=re.S)
    defines: dict[str, int] = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+([0-9]+)u?\s*$", text, flags=re.M):
        defines[m.group(1)] = int(m.group(2))
    text = re.sub(r"^\s*#[^\n]*$", " ", text, flags=re.M)          # preprocessor lines
    text = re.sub(r"\bMK_API\b", " ", text)
    for name, value in sorted(defines.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(r"\b%s\b" % name, str(value), text)
    # array sizes written as sums of constants: [64 + 1] -> [65]
    text = re.sub(r"\[(\d+)\s*\+\s*(\d+)\]", lambda m: "[%d]" % (int(m.group(1)) + int(m.group(2))), text)
    cdef = "\n".join(line for line in text.splitlines() if line.strip())
    # integer constants usable from Python (#define X 1 / 1u)
    cdef += "\n" + "\n".join("#define %s %d" % kv for kv in sorted(defines.items()))
    return cdef, defines
