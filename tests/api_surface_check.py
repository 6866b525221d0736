#!/usr/bin/env python3
"""Checks of the public surface, driven by include/meshkern.h (the one list of MK_API names).

  api_surface_check.py clears HEADER SOURCE_DIR...
      Which MK_API functions can fail is decided by the return type and the header alone:
        - fallible: every function returning mk_status, and the few others the header's
          mk_last_error comment names in "Every call that can fail (...)" (size_t results
          that are 0 on failure). Each calls mk_clear_error() as its first statement, so a
          message left by an earlier call never passes for its own.
        - cannot fail: every other MK_API function: names (*_name), defaults (*_default),
          getters (any other return type: counts, figures, pointers into an object, bool
          predicates) and the free functions (void). None may clear the message, neither
          itself nor through anything it calls (the call graph of SOURCE_DIR's functions,
          followed to the end), so the first error's message survives the cleanup and the
          figures read after a failure (`run --seam tcp` printed "MK_ERR_PEER_CLOSED: " with
          no text once mk_pipeline_seam_bytes had cleared it).
        - names: a *_default or *_name function (not *_from_name, a parser) returns no
          mk_status, so the name says which side a function is on.
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


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def declared_fallible(header):
    """The non-mk_status functions the header says can fail (its mk_last_error comment)."""
    text = pathlib.Path(header).read_text()
    m = re.search(r"Every call that can fail \((.*?)\) clears the message", text, re.S)
    if not m:
        sys.exit(f"{header}: the sentence 'Every call that can fail (...) clears the message' is missing")
    return set(re.findall(r"\bmk_[a-z0-9_]+", m.group(1))) - {"mk_status"}  # the type, not a function


def call_graph(sources):
    """name -> comment-free body for every function defined in the sources (any linkage)."""
    bodies = {}
    for text in sources.values():
        for m in re.finditer(r"^[A-Za-z_][\w \t*]*\b(mk_[a-z0-9_]+)\s*\([^;{]*\)\s*\{", text, re.M):
            body = function_body(text, m.group(1))
            if body is not None:
                bodies.setdefault(m.group(1), strip_comments(body))
    return bodies


def clearing_path(name, bodies, memo, stack=()):
    """The chain of calls from `name` to mk_clear_error, or None."""
    if name == "mk_clear_error":
        return [name]
    if name in memo:
        return memo[name]
    if name in stack or name not in bodies:
        return None
    for callee in dict.fromkeys(re.findall(r"\b(mk_[a-z0-9_]+)\s*\(", bodies[name])):
        path = clearing_path(callee, bodies, memo, stack + (name,))
        if path:
            memo[name] = [name] + path
            return memo[name]
    memo[name] = None
    return None


def check_clears(header, source_dirs):
    sources = {}
    for d in source_dirs:
        for f in sorted(pathlib.Path(d).rglob("*.c")):
            sources[f] = f.read_text()
    bodies = call_graph(sources)
    also_fallible = declared_fallible(header)
    functions = api_functions(header)
    names = {name for _, name in functions}
    bad = [f"{n}: named fallible by the header but not an MK_API function" for n in sorted(also_fallible - names)]
    fallible_checked = infallible_checked = 0
    memo = {}
    for ret, name in functions:
        body = next((b for b in (function_body(t, name) for t in sources.values()) if b is not None), None)
        if body is None:
            bad.append(f"{name}: no definition found under {', '.join(source_dirs)}")
            continue
        fallible = ret == "mk_status" or name in also_fallible
        if re.search(r"_(default|name)$", name) and not name.endswith("_from_name") and ret == "mk_status":
            bad.append(f"{name}: a *_default or *_name function cannot fail, but returns mk_status")
        if not fallible:
            infallible_checked += 1
            path = clearing_path(name, bodies, memo)
            if path:
                bad.append(f"{name}: cannot fail but clears the message ({' -> '.join(path)}); a failure's "
                           f"message would not survive it")
            continue
        fallible_checked += 1
        first = strip_comments(body).strip()
        if not first.startswith("mk_clear_error();"):
            bad.append(f"{name}: can fail but does not call mk_clear_error() on entry")
    for line in bad:
        print("FAIL", line)
    print(f"{fallible_checked} fallible MK_API functions clear on entry, {infallible_checked} that cannot fail "
          f"leave the message alone; {len(bad)} problems")
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
