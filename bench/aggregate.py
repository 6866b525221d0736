#!/usr/bin/env python3
"""The benchmark harness's aggregator (stdlib only): bench/run.sh runs the programs, this
turns their raw outputs into one JSON document, a table and gnuplot plots.

    aggregate.py collect RAW_DIR --root REPO --json OUT.json [--plots DIR]
    aggregate.py table OUT.json
    aggregate.py validate OUT.json        exit 1 with the reasons when the schema is broken
    aggregate.py prompt-ids MODEL.gguf N  e2e_bench's prompt, (i * 7919 + 13) mod vocab

The document (schema "meshkern-bench/1"):
    date, git {commit, dirty}, machine {cpu_model, cores, memory_bytes, load_before,
    load_after, gpu}, versions {meshkern, compiler, python, llama_cpp_python}, options,
    suites {NAME: {status, cases: [{case, status, elapsed_s, reason}]}},
    figures [{suite, case, name, value, unit, what, against, ratio}]
Every figure's value is finite and positive. `against` is null or {name, value, unit, kind}
with kind "ceiling" (a measured limit: ratio = value / ceiling) or "peer" (the same figure
for another engine measured in the same run: ratio = value / peer). Raw formats read: each
program's JSON as it writes it today (ceilings, e2e_bench, seam_bench, pipeline_bench,
llamacpp_peer, serve_bench, batch_bench) and kernel_bench's CSV.
"""
import csv
import datetime
import json
import math
import os
import platform
import re
import shutil
import struct
import subprocess
import sys

SCHEMA = "meshkern-bench/1"
SUITES = ["ceilings", "kernels", "e2e", "seams", "pipeline", "serve", "batch"]
STATUSES = ["ok", "failed", "not available"]


# ---- machine and versions ---------------------------------------------------------------

def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(raw):
    cpu = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0
    m = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    if m:
        mem = int(m.group(1)) * 1024
    gpu = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else ""
    return {"cpu_model": cpu or platform.processor() or "unknown", "cores": os.cpu_count() or 0,
            "memory_bytes": mem, "kernel": platform.release(),
            "load_before": _read(os.path.join(raw, "load_before")),
            "load_after": _read(os.path.join(raw, "load_after")), "gpu": gpu or None}


def versions(root, peer):
    v = {"meshkern": "unknown", "compiler": _run(["cc", "--version"]).split("\n")[0] or "unknown",
         "python": platform.python_version(), "llama_cpp_python": peer.get("llama_cpp_python") if peer else None}
    m = re.search(r"project\(meshkern VERSION ([0-9.]+)", _read(os.path.join(root, "CMakeLists.txt")))
    if m:
        v["meshkern"] = m.group(1)
    if shutil.which("nvcc"):
        m = re.search(r"release ([0-9.]+)", _run(["nvcc", "--version"]))
        v["cuda"] = m.group(1) if m else "unknown"
    return v


def git(root):
    commit = _run(["git", "-C", root, "rev-parse", "HEAD"]) or "unknown"
    # uncommitted changes to tracked files, except the harness's own outputs (bench/results)
    dirty = bool(_run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                       ":(exclude)bench/results"]))
    return {"commit": commit, "dirty": dirty}


# ---- raw outputs -> figures ---------------------------------------------------------------

def _load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Figures:
    def __init__(self):
        self.rows = []

    def add(self, suite, case, name, value, unit, what="", against=None):
        """Adds a figure when its value is a finite positive number (a zero means the program
        did not measure it: left out, not reported as a speed)."""
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return
        ratio = None
        if against is not None:
            ok = isinstance(against.get("value"), (int, float)) and math.isfinite(against["value"]) \
                and against["value"] > 0
            if ok:
                ratio = value / against["value"]
            else:
                against = None
        self.rows.append({"suite": suite, "case": case, "name": name, "value": value, "unit": unit,
                          "what": what, "against": against, "ratio": ratio})

    def find(self, suite, name):
        for r in self.rows:
            if r["suite"] == suite and r["name"] == name:
                return r
        return None


def ceiling(figs, name, fallback=None):
    r = figs.find("ceilings", name)
    if r:
        return {"name": name, "value": r["value"], "unit": r["unit"], "kind": "ceiling"}
    return fallback


def collect_ceilings(raw, figs):
    doc = _load_json(os.path.join(raw, "ceilings", "ceilings.json"))
    if not doc:
        return
    for f in doc.get("figures", []):
        figs.add("ceilings", "cuda" if f["name"].startswith("cu") else "host", f["name"], f["value"],
                 f["unit"], f"{f.get('what', '')} ({f.get('threads', 1)} threads, {f.get('bytes', 0) >> 20} MiB)")


def collect_kernels(raw, figs):
    path = os.path.join(raw, "kernels", "kernel_bench.csv")
    if not os.path.exists(path):
        return
    with open(path) as f:
        for row in csv.DictReader(f):
            gbs, pct = float(row["gb_per_s"]), float(row["pct_of_copy"])
            # the device copy measured by ceilings; kernel_bench's own copy when absent
            own = {"name": "kernel_bench d2d copy", "value": gbs * 100.0 / pct if pct > 0 else 0.0,
                   "unit": "GB/s", "kind": "ceiling"}
            case = f"{row['kernel']} {row['shape']}"
            figs.add("kernels", case, row["kernel"], gbs, "GB/s", "bytes moved per second, validated against the CPU op",
                     ceiling(figs, "cuda_d2d", own))
            figs.add("kernels", case, row["kernel"] + " flops", float(row["gflop_per_s"]), "GFLOP/s")


def collect_e2e(raw, figs, details):
    peer = _load_json(os.path.join(raw, "e2e", "llama.cpp.json"))
    peer_tps = peer.get("decode_tps_median") if peer and "error" not in peer else None
    if peer_tps:
        figs.add("e2e", "llama.cpp", "decode llama.cpp", peer_tps, "tokens/s",
                 f"llama.cpp (llama-cpp-python {peer.get('llama_cpp_python')}), {peer.get('threads')} threads, "
                 f"{peer.get('decode_tokens')} tokens, median of {len(peer.get('decode_tps_runs', []))} runs")
        details["llama.cpp"] = peer
    for backend in ("cpu", "cuda"):
        doc = _load_json(os.path.join(raw, "e2e", f"meshkern-{backend}.json"))
        if not doc:
            continue
        details[f"meshkern-{backend}"] = doc
        case = f"meshkern-{backend}"
        read_ceiling = ceiling(figs, "read_mt") if backend == "cpu" else ceiling(figs, "cuda_d2d")
        for run in ("whole", "split"):
            r = doc.get(run) or {}
            figs.add("e2e", case, f"prefill {run}", r.get("prefill_tps"), "tokens/s",
                     f"prompt of {doc.get('prompt')} tokens in one step")
            vs_peer = {"name": "decode llama.cpp", "value": peer_tps, "unit": "tokens/s", "kind": "peer"} \
                if peer_tps and backend == "cpu" else None
            figs.add("e2e", case, f"decode {run}", r.get("decode_tps"), "tokens/s",
                     f"{doc.get('decode')} greedy steps", vs_peer)
            # bytes a decode step reads: weight_gb (today) or read_bytes_per_token (issue 16)
            per_token = r.get("read_bytes_per_token") or (r.get("weight_gb") or 0) * 1e9
            if per_token and r.get("decode_tps"):
                figs.add("e2e", case, f"decode weight bandwidth {run}", per_token * r["decode_tps"] / 1e9, "GB/s",
                         "weight bytes read per decode step x steps per second", read_ceiling)


def collect_seams(raw, figs):
    """seam_bench.json holds three parts: "codec" (the wire format's pack and unpack against a
    memcpy of the same bytes), "transport" (one residual's hop per seam kind against that
    kind's ceiling: a memcpy, or the raw socket of the same family) and "batch" (a step's N
    entries as N messages vs one batch message). Rows are named by their seam kind."""
    rows = _load_json(os.path.join(raw, "seams", "seam_bench.json"))
    if isinstance(rows, dict):  # a future layout: {"results": [...]} or similar
        rows = next((v for v in rows.values() if isinstance(v, list)), [])
    for r in rows or []:
        if not isinstance(r, dict):
            continue
        part = r.get("part", "codec")
        seam = r.get("seam") or r.get("transport") or "wire"  # the codec is the wire format's
        size = r.get("payload_bytes") or 0
        if part == "codec":
            case = f"wire {size} B [{r.get('seq')}x{r.get('hidden')}]"
            copy = r.get("memcpy_gbps")
            for op in ("pack", "unpack"):
                v = r.get(f"{op}_gbps")
                figs.add("seams", case, f"{op} wire", v, "GB/s", f"{op} of a {size}-byte residual",
                         {"name": "memcpy of the same bytes", "value": copy, "unit": "GB/s", "kind": "ceiling"})
        elif part == "transport":
            case = f"{seam} {size} B [{r.get('rows')}x{r.get('hidden')}]"
            ceiling_name = r.get("ceiling", "memcpy")
            figs.add("seams", case, f"hop {seam}", r.get("hop_gbps"), "GB/s", f"one hop of a {size}-byte residual",
                     {"name": f"{ceiling_name} of the same bytes", "value": r.get("ceiling_gbps"), "unit": "GB/s",
                      "kind": "ceiling"})
            # the same measurement as a per-hop time, for the latency plot (one series per seam)
            figs.add("seams", case, f"hop latency {seam}", r.get("hop_us"), "us",
                     f"one hop of a {size}-byte residual")
        elif part == "batch":
            n = r.get("sequences") or 0
            case = f"{seam} batch of {n} [1x{r.get('hidden')}]"
            each, batch = r.get("messages_us"), r.get("batch_us")
            rate = lambda us: n / (us * 1e-6) if n and isinstance(us, (int, float)) and us > 0 else None
            figs.add("seams", case, f"entries/s in one batch {seam}", rate(batch), "entries/s",
                     f"a step's {n} entries as one batch message",
                     {"name": f"{n} messages", "value": rate(each), "unit": "entries/s", "kind": "peer"})


def collect_pipeline(raw, figs, details):
    doc = _load_json(os.path.join(raw, "pipeline", "pipeline_bench.json"))
    if not doc:
        return
    details["pipeline"] = doc
    whole = doc.get("whole_tokens_per_s")
    figs.add("pipeline", "whole", "tokens/s whole", whole, "tokens/s", "one range, sequences one after the other")
    figs.add("pipeline", "pipelined", "tokens/s pipelined", doc.get("pipeline_tokens_per_s"), "tokens/s",
             f"{doc.get('sequences')} sequences in flight over two stages",
             {"name": "tokens/s whole", "value": whole, "unit": "tokens/s", "kind": "peer"} if whole else None)
    for b in doc.get("bubble", []):
        figs.add("pipeline", f"in flight {b.get('in_flight')}", f"tokens/s in flight {b.get('in_flight')}",
                 b.get("tokens_per_s"), "tokens/s", "stage bubbles are in details.pipeline")


SERVE_FIGURES = [("tokens_per_s", "tokens/s", "tokens/s", "generated tokens per second of the level's wall time"),
                 ("requests_per_s", "requests/s", "requests/s", "streamed chat requests answered per second"),
                 ("ttft_p50_s", "ttft p50", "s", "time to first token, median over the level's requests"),
                 ("ttft_p99_s", "ttft p99", "s", "time to first token, 99th percentile")]


def collect_serve(raw, figs, details):
    """serve_bench's levels: each server's figures per concurrency level; meshkern's against
    llama-cpp-python's at the same level when both ran (ratio > 1 on TTFT: meshkern is slower)."""
    doc = _load_json(os.path.join(raw, "serve", "serve_bench.json"))
    if not doc:
        return
    details["serve"] = doc
    servers = {n: s for n, s in (doc.get("servers") or {}).items() if isinstance(s, dict)}
    peer = {lv["clients"]: lv for lv in (servers.get("llama-cpp-python") or {}).get("levels", [])}
    for name, s in servers.items():
        for lv in s.get("levels", []):
            case = f"{lv['clients']} clients"
            for key, fig, unit, what in SERVE_FIGURES:
                p = peer.get(lv["clients"], {}).get(key) if name == "meshkern" else None
                figs.add("serve", case, f"{fig} {name}", lv.get(key), unit,
                         f"{what}; {lv['clients']} clients x {doc.get('requests_per_client')} requests of "
                         f"{doc.get('max_tokens')} tokens, {doc.get('threads')} threads",
                         {"name": f"{fig} llama-cpp-python", "value": p, "unit": unit, "kind": "peer"} if p else None)


BATCH_FIGURES = [("decode_tokens_per_s", "decode tokens/s", "tokens/s",
                  "decode tokens per second of all sequences together (decode phase only)"),
                 ("per_sequence_ms_per_token", "ms/token/sequence", "ms",
                  "decode time one sequence waits for each of its tokens"),
                 ("prefill_s", "prefill", "s", "time to prefill every sequence's prompt")]


def collect_batch(raw, figs, details):
    """batch_bench's levels: each engine's figures per N; meshkern's against llama.cpp's at the
    same N when both ran (ratio > 1 on tokens/s: meshkern is faster; > 1 on ms or s: slower),
    and meshkern's unbatched run (--step-sequences 1) with the batched one against it."""
    doc = _load_json(os.path.join(raw, "batch", "batch_bench.json"))
    if not doc:
        return
    details["batch"] = doc
    where = f"{doc.get('prompt_tokens')}-token prompt, {doc.get('decode_steps')} decode steps, {doc.get('threads')} threads"
    for lv in doc.get("levels", []):
        n, peer = lv["sequences"], lv.get("llama.cpp") if isinstance(lv.get("llama.cpp"), dict) else {}
        for name in ("meshkern", "llama.cpp"):
            r = lv.get(name)
            if not isinstance(r, dict):
                continue
            for key, fig, unit, what in BATCH_FIGURES:
                p = peer.get(key) if name == "meshkern" else None
                figs.add("batch", f"{n} sequences", f"{fig} {name}", r.get(key), unit, f"{what}; {n} sequences, {where}",
                         {"name": f"{fig} llama.cpp", "value": p, "unit": unit, "kind": "peer"} if p else None)
    u = doc.get("unbatched")
    if isinstance(u, dict):
        figs.add("batch", f"{u['sequences']} sequences unbatched", "decode tokens/s meshkern step-sequences 1",
                 u.get("decode_tokens_per_s"), "tokens/s",
                 f"one sequence per forward (--step-sequences 1), {u['sequences']} in flight; {where}")
        batched = next((lv["meshkern"] for lv in doc.get("levels", [])
                        if lv["sequences"] == u["sequences"] and isinstance(lv.get("meshkern"), dict)), None)
        if batched and u.get("decode_tokens_per_s"):
            figs.add("batch", f"{u['sequences']} sequences unbatched", "decode tokens/s meshkern batched",
                     batched["decode_tokens_per_s"], "tokens/s", f"the same sequences in one batch; {where}",
                     {"name": "decode tokens/s meshkern step-sequences 1", "value": u["decode_tokens_per_s"],
                      "unit": "tokens/s", "kind": "peer"})


def manifest(raw):
    suites = {s: {"status": "not run", "cases": []} for s in SUITES}
    path = os.path.join(raw, "manifest.tsv")
    for line in _read(path).splitlines():
        parts = line.split("\t") + [""]  # _read strips an ok case's empty reason
        if len(parts) < 5:
            continue
        suite, case, status, elapsed, reason = parts[:5]
        suites.setdefault(suite, {"status": "not run", "cases": []})["cases"].append(
            {"case": case, "status": status, "elapsed_s": float(elapsed), "reason": reason})
    for s in suites.values():
        st = [c["status"] for c in s["cases"]]
        if st:
            s["status"] = "failed" if "failed" in st else "ok" if "ok" in st else "not available"
    return {k: v for k, v in suites.items() if v["cases"]}


def serve_peer(doc):
    """llama-cpp-python's section of serve_bench's JSON, when it ran (for its version)."""
    p = ((doc or {}).get("servers") or {}).get("llama-cpp-python")
    return p if isinstance(p, dict) else None


def batch_peer(doc):
    """llama.cpp's section of batch_bench's JSON, when it ran (for its version)."""
    p = (doc or {}).get("llama.cpp")
    return p if isinstance(p, dict) else None


def collect(raw, root):
    figs, details = Figures(), {}
    collect_ceilings(raw, figs)
    collect_kernels(raw, figs)
    collect_e2e(raw, figs, details)
    collect_seams(raw, figs)
    collect_pipeline(raw, figs, details)
    collect_serve(raw, figs, details)
    collect_batch(raw, figs, details)
    opts = dict(line.split("=", 1) for line in _read(os.path.join(raw, "options")).splitlines() if "=" in line)
    return {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git": git(root), "machine": machine(raw),
            "versions": versions(root, details.get("llama.cpp") or serve_peer(details.get("serve"))
                                 or batch_peer(details.get("batch"))),
            "options": opts, "suites": manifest(raw), "figures": figs.rows, "details": details}


# ---- validation -----------------------------------------------------------------------------

def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def validate(doc):
    """Returns a list of what is wrong with the document (empty when it is well formed)."""
    errs = []
    if not isinstance(doc, dict):
        return ["the document is not an object"]
    if doc.get("schema") != SCHEMA:
        errs.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", str(doc.get("date", ""))):
        errs.append("date is not an ISO-8601 UTC time")
    g = doc.get("git") or {}
    if not re.fullmatch(r"[0-9a-f]{40}|unknown", str(g.get("commit", ""))) or not isinstance(g.get("dirty"), bool):
        errs.append("git needs commit (40 hex digits) and dirty (bool)")
    m = doc.get("machine") or {}
    if not m.get("cpu_model") or not _positive(m.get("cores")) or not _positive(m.get("memory_bytes")):
        errs.append("machine needs cpu_model, cores > 0 and memory_bytes > 0")
    v = doc.get("versions") or {}
    if not v.get("meshkern") or not v.get("compiler"):
        errs.append("versions needs meshkern and compiler")
    suites = doc.get("suites")
    if not isinstance(suites, dict) or not suites:
        errs.append("suites is missing or empty")
        suites = {}
    for name, s in suites.items():
        if name not in SUITES:
            errs.append(f"unknown suite {name!r}")
        if s.get("status") not in STATUSES:
            errs.append(f"suite {name}: status {s.get('status')!r}")
        for c in s.get("cases", []):
            if c.get("status") not in STATUSES or not isinstance(c.get("elapsed_s"), (int, float)):
                errs.append(f"suite {name}: malformed case {c!r}")
            elif c["status"] != "ok" and not c.get("reason"):
                errs.append(f"suite {name} case {c.get('case')}: {c['status']} without a reason")
    figs = doc.get("figures")
    if not isinstance(figs, list):
        return errs + ["figures is not a list"]
    ran = {n for n, s in suites.items() if s.get("status") == "ok"}
    with_figures = set()
    for i, f in enumerate(figs):
        where = f"figure {i} ({f.get('suite')}/{f.get('name')})"
        for k in ("suite", "case", "name", "unit"):
            if not isinstance(f.get(k), str) or not f.get(k):
                errs.append(f"{where}: {k} missing")
        if f.get("suite") not in suites:
            errs.append(f"{where}: suite not in suites")
        if not _positive(f.get("value")):
            errs.append(f"{where}: value {f.get('value')!r} is not finite and positive")
        a = f.get("against")
        if a is None:
            if f.get("ratio") is not None:
                errs.append(f"{where}: a ratio without anything to compare against")
        else:
            if not _positive(a.get("value")) or not a.get("name") or a.get("kind") not in ("ceiling", "peer") \
                    or a.get("unit") != f.get("unit"):
                errs.append(f"{where}: against needs name, kind, a positive value and the figure's unit")
            elif not _positive(f.get("ratio")) or abs(f["ratio"] - f["value"] / a["value"]) > 1e-9 * f["ratio"]:
                errs.append(f"{where}: ratio is not value / against.value")
        with_figures.add(f.get("suite"))
    for n in sorted(ran - with_figures):
        errs.append(f"suite {n} ran ok but produced no figures")
    return errs


# ---- table -----------------------------------------------------------------------------------

def _num(x):
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def table(doc):
    m = doc["machine"]
    out = [f"meshkern bench, {doc['date']}, commit {doc['git']['commit'][:12]}{' (dirty)' if doc['git']['dirty'] else ''}",
           f"machine: {m['cpu_model']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB"
           + (f", GPU {m['gpu']}" if m.get("gpu") else "")
           + f"; load average before {' '.join(m.get('load_before', '').split(' ')[:3])}"
           f", after {' '.join(m.get('load_after', '').split(' ')[:3])}",
           f"{'suite':<9} {'case':<34} {'figure':<32} {'value':>10} {'unit':<9} {'vs':>8}  against"]
    for f in doc["figures"]:
        if f["suite"] == "seams" and " latency " in f["name"]:
            continue  # the same measurement as the GB/s row; in the JSON and the plot
        vs = f"{100 * f['ratio']:.0f}%" if f["against"] and f["against"]["kind"] == "ceiling" else \
            f"{f['ratio']:.2f}x" if f["against"] else ""
        ag = f"{f['against']['name']} {_num(f['against']['value'])} {f['against']['unit']}" if f["against"] else ""
        out.append(f"{f['suite']:<9} {f['case'][:34]:<34} {f['name'][:32]:<32} {_num(f['value']):>10} {f['unit']:<9} "
                   f"{vs:>8}  {ag}")
    for name, s in doc["suites"].items():
        for c in s["cases"]:
            if c["status"] != "ok":
                out.append(f"{name:<9} {c['case'][:34]:<34} {c['status'].upper()}: {c['reason']}")
    return "\n".join(out)


# ---- plots (gnuplot) -------------------------------------------------------------------------

def _gnuplot(script, outdir, name):
    if not shutil.which("gnuplot"):
        return None  # run.sh installs it; without it only the serve suite's own plot is there
    outdir = os.path.abspath(outdir)
    path = os.path.join(outdir, name + ".gp")
    with open(path, "w") as f:
        f.write(script)
    r = subprocess.run(["gnuplot", path], capture_output=True, text=True, cwd=outdir)
    os.remove(path)
    if r.returncode != 0:
        print(f"aggregate: gnuplot {name}: {r.stderr.strip()[:300]}", file=sys.stderr)
        return None
    return name + ".png"


HEAD = "set terminal pngcairo size 900,480 font 'sans,10'\nset grid ytics\nset key outside right\n"


def _bars(rows):
    return "\n".join(f'"{label}" {value}' for label, value in rows) + "\ne\n"


def plots(doc, outdir):
    made = []
    for old in os.listdir(outdir):
        if old.endswith(".png"):
            os.remove(os.path.join(outdir, old))
    figs = doc["figures"]
    bars = "set yrange [0:*]\nset style data histograms\nset style fill solid 0.8\nset boxwidth 0.8\nset xtics rotate by -35\n"
    k = [f for f in figs if f["suite"] == "kernels" and f["unit"] == "GB/s" and f["ratio"]]
    if k:
        made.append(_gnuplot(HEAD + bars + "set output 'kernels_pct_of_ceiling.png'\n"
                             "set title 'CUDA kernels: % of the device-to-device copy ceiling'\nset ylabel '%'\nunset key\n"
                             "plot '-' using 2:xtic(1)\n" + _bars((f["case"], 100 * f["ratio"]) for f in k),
                             outdir, "kernels_pct_of_ceiling"))
    lat = {}
    for f in figs:
        if f["suite"] == "seams" and f["unit"] == "us" and " latency " in f["name"]:
            size = int(re.search(r"(\d+) B", f["case"]).group(1))
            lat.setdefault(f["name"].replace(" latency", ""), []).append((size, f["value"]))
    if lat:
        series = sorted(lat)
        data = "".join("\n".join(f"{s} {v}" for s, v in sorted(lat[n])) + "\ne\n" for n in series)
        made.append(_gnuplot(HEAD + "set output 'seams_latency.png'\nset title 'Seam: per-hop time vs residual size'\n"
                             "set logscale xy\nset xlabel 'residual bytes'\nset ylabel 'microseconds'\n"
                             "plot " + ", ".join(f"'-' using 1:2 with linespoints title '{n}'" for n in series) + "\n"
                             + data, outdir, "seams_latency"))
    tps = [(f"{f['case']} {f['name']}".replace("meshkern-", "meshkern ").replace("llama.cpp decode llama.cpp",
                                                                                  "llama.cpp decode"), f["value"])
           for f in figs if f["suite"] == "e2e" and f["unit"] == "tokens/s" and "decode" in f["name"]]
    if tps:
        made.append(_gnuplot(HEAD + bars + "set output 'e2e_decode_tps.png'\n"
                             "set title 'Decode tokens/s: whole vs split vs llama.cpp (same model, prompt, threads)'\n"
                             "set ylabel 'tokens/s'\nunset key\nplot '-' using 2:xtic(1)\n" + _bars(tps),
                             outdir, "e2e_decode_tps"))
    pipe = [(int(re.search(r"\d+", f["case"]).group(0)), f["value"]) for f in figs
            if f["suite"] == "pipeline" and f["case"].startswith("in flight")]
    if pipe:
        made.append(_gnuplot(HEAD + "set output 'pipeline_scaling.png'\nset title 'Pipeline: tokens/s vs sequences in flight'\n"
                             "set xlabel 'sequences in flight'\nset ylabel 'tokens/s'\nunset key\n"
                             "plot '-' using 1:2 with linespoints\n" + "\n".join(f"{a} {b}" for a, b in sorted(pipe))
                             + "\ne\n", outdir, "pipeline_scaling"))
    c = [(f["name"], f["value"]) for f in figs if f["suite"] == "ceilings" and f["unit"] == "GB/s"]
    if c:
        made.append(_gnuplot(HEAD + bars + "set output 'ceilings.png'\nset title 'Measured ceilings'\n"
                             "set ylabel 'GB/s'\nunset key\nplot '-' using 2:xtic(1)\n" + _bars(c), outdir, "ceilings"))
    # serve_bench and batch_bench draw their own (matplotlib or gnuplot): copied next to the others
    serve_png = str((doc.get("details", {}).get("serve") or {}).get("plot") or "")
    if serve_png.endswith(".png") and os.path.isfile(serve_png):
        shutil.copy(serve_png, os.path.join(outdir, "serve_load.png"))
        made.append("serve_load.png")
    batch_png = str((doc.get("details", {}).get("batch") or {}).get("plot") or "")
    if batch_png.endswith(".png") and os.path.isfile(batch_png):
        shutil.copy(batch_png, os.path.join(outdir, "batch_decode.png"))
        made.append("batch_decode.png")
    return [m for m in made if m]


# ---- GGUF: the vocabulary size, for e2e_bench's prompt ---------------------------------------

def gguf_vocab(path):
    """Length of tokenizer.ggml.tokens (or llama.vocab_size) in a GGUF file's metadata."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize("<" + fmt)
            b = f.read(n)
            if len(b) != n:
                raise ValueError("truncated GGUF")
            return struct.unpack("<" + fmt, b)[0]

        def string():
            return f.read(rd("Q")).decode("utf-8", "replace")

        def skip(t):
            if t in scalar:
                rd(scalar[t])
            elif t == 8:
                f.seek(rd("Q"), 1)
            elif t == 9:
                et, n = rd("I"), rd("Q")
                for _ in range(n):
                    skip(et)
            else:
                raise ValueError(f"GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        rd("I")
        rd("Q")
        for _ in range(rd("Q")):
            key, t = string(), rd("I")
            if key == "tokenizer.ggml.tokens" and t == 9:
                rd("I")
                return rd("Q")
            if key.endswith(".vocab_size") and t in scalar:
                return int(rd(scalar[t]))
            skip(t)
    raise ValueError("no vocabulary in the GGUF metadata")


def main(argv):
    if len(argv) >= 3 and argv[1] == "collect":
        raw, args = argv[2], argv[3:]
        opt = dict(zip(args[::2], args[1::2]))
        doc = collect(raw, opt.get("--root", "."))
        errs = validate(doc)
        if "--plots" in opt:
            doc["plots"] = plots(doc, opt["--plots"])
        with open(opt["--json"], "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        for e in errs:
            print(f"aggregate: {e}", file=sys.stderr)
        return 1 if errs else 0
    if len(argv) == 3 and argv[1] in ("table", "validate"):
        with open(argv[2]) as f:
            doc = json.load(f)
        if argv[1] == "table":
            print(table(doc))
            return 0
        errs = validate(doc)
        for e in errs:
            print(f"invalid: {e}", file=sys.stderr)
        print(f"{argv[2]}: {'INVALID' if errs else 'ok'} ({len(doc.get('figures') or [])} figures)")
        return 1 if errs else 0
    if len(argv) == 4 and argv[1] == "prompt-ids":
        vocab = gguf_vocab(argv[2])
        print(",".join(str((i * 7919 + 13) % vocab) for i in range(int(argv[3]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
