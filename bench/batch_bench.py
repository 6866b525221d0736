#!/usr/bin/env python3
"""Batched decode: aggregate decode tokens/s and per-sequence latency at 1..64 concurrent
sequences, meshkern's continuous batching against llama.cpp decoding the same sequences in
one batch, measured in the same run.

    python3 bench/batch_bench.py --meshkern build/tools/meshkern --model MODEL.gguf --threads 2 \\
        --sequences 1,2,4,8,16,32,64 --decode 64 --json out.json --plot out.png

Every sequence gets the SAME prompt (--prompt-ids, default a short chat turn of SmolLM2's
template, 18 tokens) and decodes --decode tokens greedily after it.

meshkern: `meshkern run MODEL --prompts FILE --max-sequences N --threads T --max-tokens D+1
--timeline T.json` with N copies of the prompt (its --step-sequences default: every sequence
in flight in one forward). The first token of a sequence comes out of its prefill step, so
D+1 tokens make D decode tokens per sequence. The timeline has every step (one entry per
sequence it carried, with that entry's rows), timed inside the process: decode tokens/s is the
entries of the steps that are all decode rows over those steps' time (a step that mixes a
prompt chunk with decode rows counts as neither); prefill is the time until the last prompt
chunk is in (see timeline_phases). The sequences' tokens are checked: each must have made D+1
tokens (none stopped at EOS) and all N must agree (same prompt, greedy).

llama.cpp (llama-cpp-python's low-level API, one child process per N so its OpenMP threads
never overlap meshkern's): a context with n_seq_max = N, n_ctx = N * (prompt + D + 8),
n_batch = n_ubatch >= N * prompt, n_threads = n_threads_batch = T, other parameters at
llama.cpp's defaults; one llama_decode prefills all N prompts (each token on its own seq_id,
logits for each prompt's last token), then D decode steps, each ONE llama_decode of N tokens
(one per sequence, at its own position) followed by a greedy argmax over each sequence's
logits row (llama_get_logits, one numpy argmax over the N x vocab block). The decode phase is
timed from before the first of those llama_decode calls to after the last argmax (the argmax
time is also reported on its own: meshkern samples inside its step).

Per N and engine: decode tokens/s (llama.cpp: N * D / decode seconds), per-sequence ms/token
(decode seconds over the tokens each sequence made in them, = N / decode tokens/s: how long one
sequence waits for each of its tokens), prefill seconds (all N prompts); ratios
meshkern/llama.cpp and meshkern(N)/meshkern(1). Also meshkern with --step-sequences 1 (one
sequence per forward, the behaviour before batching) at --baseline-n (default 8). Each
(engine, N) runs --runs times (default 1) after one untimed warm-up run of the smallest N;
the run with the least decode time per token counts (the machine is shared; the JSON has
every run's tokens/s and the load average before each N).

Output: one JSON object on stdout (and in --json PATH), a table on stderr, and with --plot
PATH a PNG of decode tokens/s against N for both engines (log2 x axis; matplotlib if
importable, else gnuplot, else the JSON's "plot" says why not).
Exit: 0 measured (a peer whose package is missing is reported "unavailable", not an error);
1 a run failed (the JSON says which); 2 bad arguments.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

# "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"
# in SmolLM2's tokenizer (meshkern tokenize MODEL TEXT --ids)
DEFAULT_PROMPT = "1,4093,198,19161,253,1890,1977,563,253,33059,40061,30,2,198,1,520,9531,198"
PEER = "llama.cpp"


# ---- llama.cpp: the child process ---------------------------------------------------------

def peer_worker(a):
    """One N through llama.cpp; prints one JSON object (the parent reads the last line)."""
    import numpy as np
    import llama_cpp as L

    prompt = [int(t) for t in a.prompt_ids.split(",") if t]
    n, d, p = a.peer_worker, a.decode, len(prompt)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {a.model}")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    cp = L.llama_context_default_params()
    cp.n_seq_max = n
    cp.n_ctx = n * (p + d + 8)
    cp.n_batch = max(n * p, 512)
    cp.n_ubatch = cp.n_batch
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError(f"llama.cpp cannot make a context with n_seq_max={n}, n_ctx={n * (p + d + 8)}")
    info = {"n_ctx": L.llama_n_ctx(ctx), "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch, "n_seq_max": n,
            "kv_unified": bool(cp.kv_unified), "flash_attn_type": int(cp.flash_attn_type)}
    batch = L.llama_batch_init(max(n * p, n), 0, 1)

    def fill(entries):
        """entries: (token, pos, seq, wants_logits) -> the batch."""
        for i, (tok, pos, seq, out) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if out else 0
        batch.n_tokens = len(entries)

    def argmax_rows(rows):
        # the outputs of the last llama_decode, in batch order: rows x vocab floats
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(rows, n_vocab))
        return np.argmax(logits, axis=1)

    runs = []
    for _ in range(a.runs):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        fill([(tok, j, s, j == p - 1) for s in range(n) for j, tok in enumerate(prompt)])
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode (prefill of {n} x {p} tokens) returned {rc}")
        nxt = argmax_rows(n)
        prefill_s = time.perf_counter() - t0
        first = [int(nxt[0])]
        spent_argmax = 0.0
        t0 = time.perf_counter()
        for step in range(d):
            fill([(int(nxt[s]), p + step, s, True) for s in range(n)])
            rc = L.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode (decode step {step} of {n} sequences) returned {rc}")
            a0 = time.perf_counter()
            nxt = argmax_rows(n)
            spent_argmax += time.perf_counter() - a0
            first.append(int(nxt[0]))
            if step == d - 1:
                agree = bool((nxt == nxt[0]).all())
        decode_s = time.perf_counter() - t0
        runs.append({"prefill_s": prefill_s, "decode_s": decode_s, "argmax_s": spent_argmax,
                     "tokens_seq0": first, "sequences_agree": agree})
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps({"n": n, "context": info, "runs": runs}))
    return 0


def run_peer(a, n, runs, log_dir):
    """(result dict or None, error or None) of one N through llama.cpp, in a child process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--peer-worker", str(n), "--model", a.model,
           "--threads", str(a.threads), "--decode", str(a.decode), "--runs", str(runs), "--prompt-ids", a.prompt_ids]
    log = os.path.join(log_dir, f"llama.cpp-{n}.log")
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, timeout=a.timeout)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        return None, f"llama.cpp at N={n}: exit {r.returncode}: {tail(log)}"
    return json.loads(lines[-1]), None


# ---- meshkern ------------------------------------------------------------------------------

def tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            lines = [x.rstrip() for x in f if x.strip()]
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def timeline_phases(path, n, d):
    """meshkern's phases from its --timeline JSON. A step is the entries sharing (worker, start,
    end); each entry is one sequence's rows in it (a prompt chunk, or 1 for a decode row).
    - decode: the steps whose entries are all decode rows; each costs the time from the end of
      the step before it to its own end (the scheduler's gap included); tokens/s = their
      entries / their cost. Steps mixing a prompt chunk with decode rows are left out of it.
    - per-sequence span per token (an extra, in the JSON only): for each sequence, from the end
      of the step that finished its prompt (its first token) to the end of its last step, over
      its d decode tokens; the mean over the sequences (it includes waiting for the other
      sequences' prompts when those come after its own).
    - prefill: from the first step's start to the end of the last step holding a prompt chunk
      (every prompt in), as llama.cpp's one prefill call of all N prompts."""
    with open(path) as f:
        doc = json.load(f)
    steps = {}
    for e in doc["steps"]:
        steps.setdefault((e["worker"], e["start_us"], e["end_us"]), []).append(e)
    keys = sorted(steps, key=lambda k: (k[2], k[1]))
    t_start = keys[0][1]
    prev_end, decode_us, decode_tokens, decode_steps, prefill_end = t_start, 0.0, 0, 0, t_start
    first_end, last_end, mixed = {}, {}, 0
    for k in keys:
        es = steps[k]
        if all(e["rows"] == 1 for e in es):
            decode_us += k[2] - prev_end
            decode_tokens += len(es)
            decode_steps += 1
        else:
            prefill_end = k[2]
            mixed += any(e["rows"] == 1 for e in es)
        for e in es:
            if e["rows"] > 1 or e["seq"] not in first_end:
                first_end[e["seq"]] = k[2]  # the step that finished its prompt (the last chunk)
            last_end[e["seq"]] = k[2]
        prev_end = k[2]
    if not decode_steps:
        raise RuntimeError(f"{path}: no decode step")
    per_seq = [(last_end[q] - first_end[q]) / d for q in first_end]
    if len(per_seq) != n:
        raise RuntimeError(f"{path}: {len(per_seq)} sequences in the timeline, expected {n}")
    return {"decode_s": decode_us / 1e6, "decode_tokens": decode_tokens, "decode_steps": decode_steps,
            "mixed_steps": mixed, "span_s_per_token": sum(per_seq) / len(per_seq) / 1e6,
            "prefill_s": (prefill_end - t_start) / 1e6}


def run_meshkern(a, n, step_sequences, work, tag):
    """One meshkern run of N copies of the prompt: its figures, or raises with the reason."""
    prompts = os.path.join(work, f"prompts-{n}.txt")
    with open(prompts, "w") as f:
        f.write((a.prompt_ids + "\n") * n)
    tl = os.path.join(work, f"timeline-{tag}.json")
    cmd = [a.meshkern, "run", a.model, "--prompts", prompts, "--max-tokens", str(a.decode + 1), "--max-sequences",
           str(n), "--threads", str(a.threads), "--timeline", tl, *shlex.split(a.meshkern_args)]
    if step_sequences:
        cmd += ["--step-sequences", str(step_sequences)]
    t0 = time.perf_counter()
    # errors="replace": a model's text may stop inside a multi-byte character (the tokens are what count)
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=a.timeout)
    wall = time.perf_counter() - t0
    log = os.path.join(work, f"meshkern-{tag}.log")
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"meshkern at N={n} ({tag}): exit {r.returncode}: {tail(log)}")
    seqs = [(int(m.group(2)), [int(t) for t in m.group(3).split()])
            for m in re.finditer(r"^seq \d+ \(\d+ prompt tokens\): (\w+), (\d+) tokens:([ 0-9]*)$", r.stdout, re.M)]
    if len(seqs) != n or any(k != a.decode + 1 for k, _ in seqs):
        raise RuntimeError(f"meshkern at N={n} ({tag}): expected {n} sequences of {a.decode + 1} tokens, got "
                           f"{[k for k, _ in seqs]} (a sequence stopped at EOS? another prompt or fewer tokens)")
    ph = timeline_phases(tl, n, a.decode)
    m = re.search(r"^aggregate: .* in ([0-9.]+) s", r.stdout, re.M)
    return {**ph, "run_s": float(m.group(1)) if m else None,
            "process_s": round(wall, 3), "tokens_seq0": seqs[0][1],
            "sequences_agree": all(t == seqs[0][1] for _, t in seqs)}


# ---- figures -------------------------------------------------------------------------------

def figures(run, n, d):
    """One engine's figures at one N from its best run (least decode time per token). Decode
    tokens: llama.cpp gives every step all N sequences (N * d); meshkern's are counted in its
    timeline. Per-sequence ms/token: decode seconds over the tokens each sequence made in them
    (tokens / N), i.e. N / tokens/s: how long one sequence waits for each of its tokens."""
    tokens = run.get("decode_tokens", n * d)
    return {"decode_tokens_per_s": round(tokens / run["decode_s"], 2),
            "per_sequence_ms_per_token": round(1e3 * run["decode_s"] * n / tokens, 3),
            "decode_s": round(run["decode_s"], 4), "decode_tokens": tokens, "prefill_s": round(run["prefill_s"], 4)}


def loadavg():
    """The 1, 5 and 15 minute load averages (the machine may be shared: figures are lower bounds)."""
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def best(runs):
    return min(runs, key=lambda r: r["decode_s"] / r.get("decode_tokens", 1))


def common_prefix(x, y):
    k = 0
    while k < min(len(x), len(y)) and x[k] == y[k]:
        k += 1
    return k


def plot(doc, path):
    """Decode tokens/s against N, both engines (and the unbatched point); returns the path or
    "skipped: why"."""
    series = {}
    for lv in doc["levels"]:
        for eng in ("meshkern", PEER):
            if isinstance(lv.get(eng), dict):
                series.setdefault(eng, []).append((lv["sequences"], lv[eng]["decode_tokens_per_s"]))
    if not series:
        return "skipped: nothing was measured"
    base = doc.get("unbatched")
    base_pt = (base["sequences"], base["decode_tokens_per_s"]) if isinstance(base, dict) else None
    ticks = sorted({x for s in series.values() for x, _ in s})
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt:
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for i, (name, pts) in enumerate(series.items()):
            ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=f"C{i}", label=name)
        if base_pt:
            ax.plot([base_pt[0]], [base_pt[1]], "x", color="C3", markersize=9,
                    label="meshkern --step-sequences 1 (no batching)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent sequences (one batch)")
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(doc["title"], fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    if not shutil.which("gnuplot"):
        return "skipped: neither matplotlib nor gnuplot is installed"
    names = list(series)
    data = "".join("\n".join(f"{x} {y}" for x, y in series[nm]) + "\ne\n" for nm in names)
    plots = [f"'-' using 1:2 with linespoints lc {i + 1} title '{nm}'" for i, nm in enumerate(names)]
    if base_pt:
        plots.append("'-' using 1:2 with points pt 2 ps 2 lc 4 title 'meshkern --step-sequences 1 (no batching)'")
        data += f"{base_pt[0]} {base_pt[1]}\ne\n"
    script = (f"set terminal pngcairo noenhanced size 800,460 font 'sans,9'\nset output '{path}'\n"
              f"set title \"{doc['title']}\"\nset logscale x 2\nset xtics ({', '.join(map(str, ticks))})\nset grid\n"
              "set key top left\nset xlabel 'concurrent sequences (one batch)'\n"
              "set ylabel 'decode tokens/s (all sequences)'\nset yrange [0:*]\n"
              "plot " + ", ".join(plots) + "\n" + data)
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if r.returncode != 0:
        return f"skipped: gnuplot failed ({r.stderr.strip()[:200]})"
    return path


def table(doc):
    f = lambda v, w, p: "-".rjust(w) if v is None else f"{v:>{w}.{p}f}"  # noqa: E731
    rows = [f"{'N':>3} | {'meshkern tok/s':>14} {'ms/tok/seq':>10} {'prefill s':>9} | {'llama.cpp tok/s':>15} "
            f"{'ms/tok/seq':>10} {'prefill s':>9} | {'mk/llama':>8} {'mk(N)/mk(1)':>11}"]
    for lv in doc["levels"]:
        m = lv.get("meshkern") if isinstance(lv.get("meshkern"), dict) else {}
        p = lv.get(PEER) if isinstance(lv.get(PEER), dict) else {}
        rows.append(f"{lv['sequences']:>3} | {f(m.get('decode_tokens_per_s'), 14, 1)} "
                    f"{f(m.get('per_sequence_ms_per_token'), 10, 2)} {f(m.get('prefill_s'), 9, 3)} | "
                    f"{f(p.get('decode_tokens_per_s'), 15, 1)} {f(p.get('per_sequence_ms_per_token'), 10, 2)} "
                    f"{f(p.get('prefill_s'), 9, 3)} | {f(lv.get('meshkern_over_peer'), 7, 2)}x "
                    f"{f(lv.get('meshkern_over_one'), 10, 2)}x")
    b = doc.get("unbatched")
    if isinstance(b, dict):
        rows.append(f"meshkern --step-sequences 1 at N={b['sequences']}: {b['decode_tokens_per_s']:.1f} tok/s, "
                    f"{b['per_sequence_ms_per_token']:.2f} ms/tok/seq (batched: {b['batched_over_unbatched']:.2f}x)"
                    if b.get("batched_over_unbatched") else
                    f"meshkern --step-sequences 1 at N={b['sequences']}: {b['decode_tokens_per_s']:.1f} tok/s")
    for e in doc.get("errors", []):
        rows.append(f"FAILED: {e}")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshkern", help="the meshkern binary (build/tools/meshkern)")
    ap.add_argument("--model", required=True,
                    help="GGUF path (both engines), or meshkern's --random:SHAPE (write --model=--random:...; "
                         "meshkern only: --peer none)")
    ap.add_argument("--meshkern-args", default="",
                    help="more options of meshkern run, e.g. '--backend cuda --dtype bf16 --speed' (the GPU check)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each engine")
    ap.add_argument("--sequences", default="1,2,4,8,16,32,64", help="concurrent sequences, comma-separated")
    ap.add_argument("--decode", type=int, default=64, help="decode steps per sequence after its prefill")
    ap.add_argument("--runs", type=int, default=1, help="timed runs per engine and N (the best counts)")
    ap.add_argument("--prompt-ids", default=DEFAULT_PROMPT, help="the prompt of every sequence (token ids)")
    ap.add_argument("--peer", choices=["none", "llama-cpp"], default="llama-cpp")
    ap.add_argument("--baseline-n", type=int, default=8, help="N of the --step-sequences 1 run (0: none)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one engine may take at one N")
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--plot", help="write the PNG here")
    ap.add_argument("--log-dir", help="logs, prompt files and timelines (default: a temporary folder)")
    ap.add_argument("--peer-worker", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer_worker:
        return peer_worker(a)
    if not a.meshkern:
        ap.error("--meshkern is required")
    try:
        levels_wanted = [int(x) for x in a.sequences.split(",") if x.strip()]
        assert levels_wanted and min(levels_wanted) > 0 and max(levels_wanted) <= 64
        prompt = [int(t) for t in a.prompt_ids.split(",") if t.strip()]
        assert prompt and a.decode > 0 and a.runs > 0 and a.threads > 0
    except (ValueError, AssertionError):
        ap.error("--sequences: 1..64, comma-separated; --prompt-ids: token ids; --decode, --runs, --threads > 0")
    work = a.log_dir or tempfile.mkdtemp(prefix="batch_bench.")
    os.makedirs(work, exist_ok=True)

    peer_why, peer_version = None, None
    if a.peer == "llama-cpp":
        r = subprocess.run([sys.executable, "-c", "import llama_cpp, numpy; print(llama_cpp.__version__)"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            peer_why = ("llama-cpp-python is not importable ("
                        f"{(r.stderr.strip().splitlines() or ['import failed'])[-1]}); pip install llama-cpp-python")
        else:
            peer_version = r.stdout.strip()
    load_before = loadavg()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = lambda *c: subprocess.run(["git", "-C", root, *c], capture_output=True, text=True).stdout.strip()  # noqa: E731
    if a.model.startswith("--random") and a.peer != "none":
        ap.error("a --random model is meshkern's own: run it with --peer none")
    backend = re.search(r"--backend\s+(\S+)", a.meshkern_args)
    doc = {"title": f"{os.path.basename(a.model)}, {backend.group(1) if backend else 'cpu'}, {a.threads} threads, "
                    f"prompt {len(prompt)} tokens, "
                    f"{a.decode} decode steps per sequence",
           "git": {"commit": git("rev-parse", "HEAD") or "unknown",
                   "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))},
           "model": a.model, "threads": a.threads, "prompt_tokens": len(prompt), "prompt_ids": a.prompt_ids,
           "decode_steps": a.decode, "runs": a.runs, "sequences": levels_wanted,
           "meshkern": {"binary": a.meshkern, "step_sequences": "default (every sequence in flight)",
                        "args": a.meshkern_args},
           PEER: "not run (--peer none)" if a.peer == "none" else f"unavailable: {peer_why}" if peer_why else
           {"llama_cpp_python": peer_version, "api": "llama_decode, one batch of N tokens per decode step"},
           "load_before": load_before, "levels": [], "errors": []}

    # warm-up: page the model in for both engines, untimed
    try:
        run_meshkern(a, min(levels_wanted), 0, work, "warmup")
    except Exception as e:  # noqa: BLE001 - reported; the levels below fail the same way
        doc["errors"].append(f"warm-up: {e}")
    if a.peer == "llama-cpp" and not peer_why:
        run_peer(a, min(levels_wanted), 1, work)

    one = None
    for n in levels_wanted:
        lv = {"sequences": n, "load_before": loadavg()}
        # interleaved per N: both engines see the same machine state, one at a time
        try:
            runs = [run_meshkern(a, n, 0, work, f"{n}-{i}") for i in range(a.runs)]
            b = best(runs)
            lv["meshkern"] = figures(b, n, a.decode)
            lv["meshkern"].update(decode_steps=b["decode_steps"], mixed_steps=b["mixed_steps"],
                                  span_ms_per_token=round(1e3 * b["span_s_per_token"], 3),
                                  sequences_agree=b["sequences_agree"], run_s=b["run_s"],
                                  decode_tokens_per_s_runs=[round(r["decode_tokens"] / r["decode_s"], 2) for r in runs])
            mk_tokens = b["tokens_seq0"]
        except Exception as e:  # noqa: BLE001
            lv["meshkern"] = f"failed: {e}"
            doc["errors"].append(str(e))
            mk_tokens = None
        if a.peer == "llama-cpp" and not peer_why:
            res, err = run_peer(a, n, a.runs, work)
            if err:
                lv[PEER] = f"failed: {err}"
                doc["errors"].append(err)
            else:
                b = best(res["runs"])
                lv[PEER] = figures(b, n, a.decode)
                lv[PEER].update(argmax_s=round(b["argmax_s"], 4), sequences_agree=b["sequences_agree"],
                                context=res["context"],
                                decode_tokens_per_s_runs=[round(n * a.decode / r["decode_s"], 2) for r in res["runs"]])
                if mk_tokens:  # same prompt, greedy: how far the two engines' first sequences agree
                    lv["tokens_agree_with_peer"] = common_prefix(mk_tokens, b["tokens_seq0"])
        m, p = lv.get("meshkern"), lv.get(PEER)
        if isinstance(m, dict) and isinstance(p, dict):
            lv["meshkern_over_peer"] = round(m["decode_tokens_per_s"] / p["decode_tokens_per_s"], 3)
        if isinstance(m, dict):
            one = one or (m["decode_tokens_per_s"] if n == 1 else None)
            lv["meshkern_over_one"] = round(m["decode_tokens_per_s"] / one, 3) if one else None
        doc["levels"].append(lv)
        print(f"batch_bench: N={n}: " + json.dumps(lv), file=sys.stderr, flush=True)

    if a.baseline_n:
        n = a.baseline_n
        try:
            b = best([run_meshkern(a, n, 1, work, f"{n}-unbatched-{i}") for i in range(a.runs)])
            doc["unbatched"] = {"sequences": n, "step_sequences": 1, **figures(b, n, a.decode)}
            batched = next((lv["meshkern"] for lv in doc["levels"]
                            if lv["sequences"] == n and isinstance(lv.get("meshkern"), dict)), None)
            if batched:
                doc["unbatched"]["batched_over_unbatched"] = round(
                    batched["decode_tokens_per_s"] / doc["unbatched"]["decode_tokens_per_s"], 3)
        except Exception as e:  # noqa: BLE001
            doc["unbatched"] = f"failed: {e}"
            doc["errors"].append(str(e))
    doc["load_after"] = loadavg()
    doc["log_dir"] = work
    if a.plot:
        doc["plot"] = plot(doc, a.plot)
        if doc["plot"].startswith("skipped"):
            print(f"batch_bench: plot {doc['plot']}", file=sys.stderr)
    print(table(doc), file=sys.stderr)
    print(json.dumps(doc, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    failed = any(isinstance(lv.get(k), str) for lv in doc["levels"] for k in ("meshkern", PEER))
    return 1 if failed or isinstance(doc.get("unbatched"), str) else 0


if __name__ == "__main__":
    sys.exit(main())
