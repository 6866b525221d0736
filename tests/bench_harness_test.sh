#!/usr/bin/env bash
# The benchmark harness end to end on a tiny real run: bench/run.sh --suite ceilings --tiny
# with the ceilings program of this build, then the JSON document's schema (not its values:
# speed targets live in benchmarks). The validator must also refuse documents broken in the
# ways a harness bug would break them, or passing it would mean nothing.
#
#   bench_harness_test.sh SOURCE_DIR BIN_DIR WORK_DIR
set -uo pipefail
SRC=$1 BIN=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }

"$SRC/bench/run.sh" --suite ceilings --tiny --bin-dir "$BIN" --out "$WORK" --no-install --no-plots \
  >"$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "run.sh exited non-zero"; }
grep -q 'ceilings / host: running' "$WORK/run.log" || fail "no progress line"
grep -q 'read_mt' "$WORK/table.txt" || fail "the table has no read_mt row"
python3 "$SRC/bench/aggregate.py" validate "$WORK/results.json" || fail "the tiny run's document is invalid"

# the run's figures: all three host ceilings, each finite and positive, in GB/s
python3 - "$WORK/results.json" <<'PY' || fail "figures"
import json, math, sys
doc = json.load(open(sys.argv[1]))
names = sorted(f["name"] for f in doc["figures"] if f["suite"] == "ceilings")
assert names == ["memcpy_1t", "read_1t", "read_mt"], names
for f in doc["figures"]:
    assert f["unit"] == "GB/s" and math.isfinite(f["value"]) and f["value"] > 0, f
assert doc["suites"]["ceilings"]["status"] == "ok", doc["suites"]
assert doc["machine"]["cores"] >= 1 and doc["options"]["mode"] == "tiny"
PY

# broken documents are refused, each for its own reason
python3 - "$SRC/bench/aggregate.py" "$WORK/results.json" <<'PY' || fail "the validator accepts a broken document"
import copy, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("aggregate", sys.argv[1])
agg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agg)
good = json.load(open(sys.argv[2]))
assert agg.validate(good) == [], agg.validate(good)

def broken(change, expect):
    doc = copy.deepcopy(good)
    change(doc)
    errs = agg.validate(doc)
    assert any(expect in e for e in errs), (expect, errs)

def set_(path, value):
    def f(doc):
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return f

broken(set_(["figures", 0, "value"], float("nan")), "not finite and positive")
broken(set_(["figures", 1, "value"], float("inf")), "not finite and positive")
broken(set_(["figures", 2, "value"], 0.0), "not finite and positive")
broken(set_(["figures", 0, "value"], -3.5), "not finite and positive")
broken(set_(["figures", 0, "unit"], ""), "unit missing")
broken(set_(["figures", 0, "ratio"], 0.5), "ratio without anything")
broken(set_(["figures", 0, "against"], {"name": "x", "value": 2.0, "unit": "GB/s", "kind": "ceiling"}),
       "ratio is not value / against.value")
broken(set_(["figures", 0, "against"], {"name": "x", "value": 2.0, "unit": "tokens/s", "kind": "ceiling"}),
       "the figure's unit")
broken(set_(["figures"], []), "produced no figures")
broken(set_(["machine", "cores"], 0), "machine needs")
broken(set_(["git", "commit"], "abc"), "git needs")
broken(set_(["schema"], "meshkern-bench/0"), "schema is")
broken(set_(["date"], "yesterday"), "date is not")
broken(set_(["suites", "ceilings", "cases", 0, "status"], "failed"), "without a reason")
broken(set_(["suites", "warp"], {"status": "ok", "cases": []}), "unknown suite")
PY

# the README section is generated from the document: its numbers come from the JSON, the text
# around the markers is kept, and an invalid document is refused without touching the file
printf '# title\nbefore\n<!-- bench:begin -->\nstale 123\n<!-- bench:end -->\nafter\n' >"$WORK/README.md"
python3 "$SRC/scripts/bench_readme.py" "$WORK/results.json" "$WORK/README.md" >/dev/null || fail "bench_readme.py"
python3 - "$WORK/results.json" "$WORK/README.md" <<'PY' || fail "the generated README section"
import json, sys
doc, text = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
assert text.startswith("# title\nbefore\n<!-- bench:begin -->") and text.endswith("<!-- bench:end -->\nafter\n"), text
assert "stale 123" not in text and doc["date"] in text and doc["machine"]["cpu_model"] in text
for f in doc["figures"]:
    v = f["value"]
    shown = f"{v:.3g}" if v < 100 else f"{v:.0f}"
    assert f"| {f['name']} | {shown} {f['unit']} |" in text, (f, text)
PY
cp "$WORK/README.md" "$WORK/README.before"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["figures"][0]["value"]=0; json.dump(d,open(sys.argv[2],"w"))' \
  "$WORK/results.json" "$WORK/bad.json"
python3 "$SRC/scripts/bench_readme.py" "$WORK/bad.json" "$WORK/README.md" 2>/dev/null && fail "an invalid document was accepted"
cmp -s "$WORK/README.md" "$WORK/README.before" || fail "an invalid document changed the README"

# the seams suite on this build's seam_bench: each hop, its latency and its batch figure are
# named by the seam kind that made them (every kind was once reported as "wire"), each hop
# against its own ceiling
"$SRC/bench/run.sh" --suite seams --tiny --bin-dir "$BIN" --out "$WORK/seams" --no-install --no-plots \
  >"$WORK/seams.log" 2>&1 || { cat "$WORK/seams.log"; fail "run.sh --suite seams exited non-zero"; }
python3 "$SRC/bench/aggregate.py" validate "$WORK/seams/results.json" || fail "the seams document is invalid"
python3 - "$WORK/seams/results.json" <<'PY' || fail "the seams figures"
import json, re, sys
doc = json.load(open(sys.argv[1]))
figs = [f for f in doc["figures"] if f["suite"] == "seams"]
kinds = {"local", "wire", "unix", "tcp"}
for what, unit in (("hop", "GB/s"), ("hop latency", "us"), ("entries/s in one batch", "entries/s")):
    seen = {f["name"][len(what) + 1:] for f in figs if f["name"].startswith(what + " ") and f["unit"] == unit}
    assert kinds <= seen, (what, seen)
for f in figs:
    seam = f["name"].rsplit(" ", 1)[1]
    assert f["case"].startswith(seam + " "), f  # the case names the seam of its figure
    if f["name"].startswith("hop ") and f["unit"] == "GB/s":
        want = "raw " + seam.split("+")[0] if seam.split("+")[0] in ("unix", "tcp") else "memcpy"
        assert f["against"]["kind"] == "ceiling" and f["against"]["name"].startswith(want), f
sizes = {int(re.search(r"(\d+) B", f["case"]).group(1)) for f in figs if f["name"] == "hop latency tcp"}
assert len(sizes) >= 3, sizes  # one point per residual size for the latency plot
PY

# a suite whose program is not there is "not available", with a reason, and no error
mkdir -p "$WORK/empty-bin"
"$SRC/bench/run.sh" --suite seams --tiny --bin-dir "$WORK/empty-bin" --out "$WORK/na" --no-install --no-plots \
  >"$WORK/na.log" 2>&1 || { cat "$WORK/na.log"; fail "a program not built on purpose made run.sh fail"; }
python3 - "$WORK/na/results.json" <<'PY' || fail "a missing program"
import json, sys
doc = json.load(open(sys.argv[1]))
case = doc["suites"]["seams"]["cases"][0]
assert case["status"] == "not available" and "not built" in case["reason"], case
PY
echo "bench harness: ok"
