#!/usr/bin/env python3
"""Fail on any #include in host/, tools/ or kernels/ that points up the floors of host/LAYERS.

Usage: layer_check.py [ROOT]   (ROOT defaults to the repository holding this script)
Each violation prints as FILE:LINE: the include, its floor and the including file's floor.
kernels/ sees only device code and the public header (the style's rule), so it is checked
as the floor 'kernels'."""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_layers(path):
    floors = {}  # folder or header name -> (rank, floor name)
    for rank, line in enumerate(l for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")):
        name, *members = line.split()
        for m in members:
            floors[m] = (rank, name)
    return floors


def unit_of(root, path):
    """The floor member a file belongs to: tools, kernels, or its first folder under host/,
    plus its sub-folder (for the sibling rule), or None when it is not checked."""
    rel = path.relative_to(root).parts
    if rel[0] in ("tools", "kernels"):
        return rel[0], None
    if rel[0] == "host" and len(rel) > 2:
        return rel[1], rel[2] if len(rel) > 3 else None
    return None, None


def target_of(root, floors, including, name):
    """(member, sub-folder) an include names, or (None, None) if it names nothing known."""
    first = name.split("/")[0]
    if "/" in name and first in floors:
        parts = name.split("/")
        return first, parts[1] if len(parts) > 2 else None
    local = including.parent / name
    if local.exists():
        return unit_of(root, local.resolve())
    if name in floors:
        return name, None
    return None, None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent).resolve()
    floors = read_layers(root / "host" / "LAYERS")
    files = [p for top in ("host", "tools", "kernels") for p in sorted((root / top).rglob("*"))
             if p.suffix in (".c", ".h", ".cu", ".cuh", ".cpp")]
    bad = 0
    checked = 0
    for f in files:
        unit, sub = unit_of(root, f)
        if unit is None:
            continue
        if unit not in floors:
            print(f"{f.relative_to(root)}: folder '{unit}' is on no floor of host/LAYERS")
            bad += 1
            continue
        rank, floor = floors[unit]
        for lineno, line in enumerate(f.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            checked += 1
            name = m.group(1)
            tunit, tsub = target_of(root, floors, f, name)
            where = f"{f.relative_to(root)}:{lineno}: #include \"{name}\""
            if tunit is None:
                # a header of the file's own folder tree outside host/ (kernels/*.cuh, tools/*.h)
                # (the kernels' compat header lives in one flavour folder per toolchain)
                if unit in ("kernels", "tools") and any((root / unit).rglob(pathlib.Path(name).name)):
                    continue
                print(f"{where} names no floor of host/LAYERS")
                bad += 1
                continue
            trank, tfloor = floors[tunit]
            if trank > rank:
                print(f"{where} points up: '{tunit}' is on floor '{tfloor}', above '{floor}' of '{unit}'")
                bad += 1
            elif trank == rank and tunit != unit and "." not in tunit:
                print(f"{where} crosses a floor: '{tunit}' and '{unit}' share floor '{floor}'")
                bad += 1
            elif tunit == unit and sub is not None and tsub is not None and sub != tsub:
                print(f"{where} crosses sub-folders: {unit}/{sub} includes {unit}/{tsub}")
                bad += 1
    print(f"layer_check: {checked} includes in {len(files)} files, {bad} pointing up or across")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
