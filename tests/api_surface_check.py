#!/usr/bin/env python3
"""Checks of the public surface, driven by include/meshkern.h (the one list of MK_API names).

  api_surface_check.py clears HEADER SOURCE_DIR...
      Every MK_API function that can fail (returns mk_status, or records a failure in its
      body) calls mk_clear_error() as its first statement, so a message left by an earlier
      call never passes for its own; and every one that cannot fail (getters, free
      functions, defaults) leaves the message alone, so the first error's message survives
      the cleanup and the figures read after a failure (`run --seam tcp` printed
      "MK_ERR_PEER_CLOSED: " with no text once mk_pipeline_seam_bytes had cleared it).
  api_surface_check.py symbols HEADER LIBRARY
      The shared library's dynamic symbol table defines exactly the MK_API functions:
      nothing else (protobuf-c, OpenSSL wrappers, internal helpers) leaks, nothing is missing.
"""
import pathlib
import re
import subprocess
import sys


def api_functions(header):
    """(return type, name) of every MK_API declaration in the header."""
    text = pathlib.Path(header).read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    decls = re.findall(r"\bMK_API\s+([^;{()]*?)\b(mk_[a-z0-9_]+)\s*\(", text)
    if not decls:
        sys.exit(f"no MK_API declarations found in {header}")
    return [(" ".join(ret.split()), name) for ret, name in decls]


def function_body(text, name):
    """The body of the definition of `name` in C source text, or None."""
    m = re.search(r"^[A-Za-z_][\w \t*]*\b" + name + r"\s*\([^;{]*\)\s*\{", text, re.M)
    if not m:
        return None
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end():i - 1]


def check_clears(header, source_dirs):
    sources = {}
    for d in source_dirs:
        for f in sorted(pathlib.Path(d).rglob("*.c")):
            sources[f] = f.read_text()
    bad = []
    checked = 0
    for ret, name in api_functions(header):
        body = next((b for b in (function_body(t, name) for t in sources.values()) if b is not None), None)
        if body is None:
            bad.append(f"{name}: no definition found under {', '.join(source_dirs)}")
            continue
        fallible = ret == "mk_status" or re.search(r"\bmk_fail\s*\(|\bMK_TRY\s*\(|!=\s*MK_OK", body)
        if not fallible:
            if re.search(r"\bmk_clear_error\s*\(", re.sub(r"/\*.*?\*/", " ", body, flags=re.S)):
                bad.append(f"{name}: cannot fail but clears the message (a failure's message would not survive it)")
            continue
        checked += 1
        first = re.sub(r"/\*.*?\*/", " ", body, flags=re.S).strip()
        if not first.startswith("mk_clear_error();"):
            bad.append(f"{name}: can fail but does not call mk_clear_error() on entry")
    for line in bad:
        print("FAIL", line)
    print(f"{checked} fallible MK_API functions checked, {len(bad)} problems")
    return not bad


def check_symbols(header, library):
    wanted = {name for _, name in api_functions(header)}
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    exported = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        kind, sym = parts[1], parts[2].split("@")[0]
        if kind == "A":  # version node names (MESHKERN_0) are absolute symbols, not code
            continue
        exported.add(sym)
    extra = sorted(exported - wanted)
    missing = sorted(wanted - exported)
    for s in extra:
        print("FAIL exported but not MK_API:", s)
    for s in missing:
        print("FAIL MK_API but not exported:", s)
    print(f"{len(exported)} dynamic symbols in {library}, {len(wanted)} MK_API functions; "
          f"{len(extra)} extra, {len(missing)} missing")
    return not extra and not missing


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "clears":
        ok = check_clears(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "symbols":
        ok = check_symbols(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
