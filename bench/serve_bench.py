#!/usr/bin/env python3
"""Load on OpenAI-compatible servers: requests/s, tokens/s and time to first token, for
`meshkern serve` and llama-cpp-python's server on the same GGUF in the same run.

    python3 bench/serve_bench.py --meshkern build/tools/meshkern --model MODEL.gguf --threads 2 \\
        --peer llama-cpp --clients 1,4,16,32 --json out.json --plot out.png
    python3 bench/serve_bench.py --url http://127.0.0.1:8000 --model-name NAME   (any running server)

With --meshkern the bench starts `meshkern serve MODEL --threads T --ctx C --max-sequences S`
on a free port; with --peer llama-cpp it then starts `python3 -m llama_cpp.server --model MODEL
--n_threads T --n_threads_batch T --n_ctx C` (its chat template comes from the GGUF) and waits
until /v1/models answers (--peer-timeout). One server runs at a time: each is stopped before
the next starts, so they never share the cores. Both get the same levels and prompts.

For each concurrency level (--clients) that many clients each send --requests streamed chat
requests one after another (distinct prompts, greedy, --max-tokens each, stop strings off)
after one warm-up request per server. Per level: requests/s and generated tokens/s over the
level's wall time, and time to first token (first non-empty content chunk) p50/p99 over its
requests. Generated tokens are the server's usage counts (stream_options.include_usage); for a
server that sends none (llama-cpp-python) max_tokens when the answer ends for length, else its
content chunks (about one a token; the level's "tokens_from" says which were used).
The HTTP client is http.client (standard library), so the client adds little of its own time.

Output: one JSON object on stdout (and in --json PATH):
    {"servers": {"meshkern": {..., "levels": [...]}, "llama-cpp-python": {...} or "unavailable: why"},
     "ratios": [{"clients", "tokens_per_s", "requests_per_s", "ttft_p50_s"}]   (meshkern / peer)}
and a table on stderr. --plot PATH: tokens/s and TTFT p50/p99 against clients, both servers,
one PNG (matplotlib if importable, else gnuplot if on PATH, else the JSON's "plot" says why not).
Exit: 0 measured (a peer whose package is missing is reported "unavailable", not an error);
1 a server did not start or a request failed (the JSON says which); 2 bad arguments.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

TOPICS = ["the sea", "a city at night", "a mountain", "winter", "a library", "a train journey", "bread",
          "the moon", "a garden", "rain", "a lighthouse", "music", "an old map", "a river", "a market", "snow"]
PEER = "llama-cpp-python"


def one_request(url, model, prompt, max_tokens, key):
    """(seconds to the first text, total seconds, completion tokens, where the count came from)
    of one streamed chat."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    ttft, usage, chunks, done, finish = None, None, 0, False, None
    for raw in resp:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
        if not line.startswith("data: ") or done:
            continue
        chunk = json.loads(line[6:])
        for ch in chunk.get("choices") or []:
            finish = ch.get("finish_reason") or finish
            if (ch.get("delta") or {}).get("content"):
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    conn.close()
    if not done:  # a server that died mid-answer closes the stream early: not an answer
        raise RuntimeError(f"the stream ended without [DONE] after {chunks} chunks")
    # Without usage (llama-cpp-python's stream has none): an answer cut at max_tokens has exactly
    # that many; otherwise count the content chunks, about one a token (a server may merge a few)
    if usage is not None:
        tokens, source = usage, "usage"
    elif finish == "length":
        tokens, source = max_tokens, "finish_reason length"
    else:
        tokens, source = chunks, "chunks"
    return ttft if ttft is not None else total, total, tokens, source


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]


def level(url, model, clients, per_client, max_tokens, key):
    results, errors, lock = [], [], threading.Lock()

    def client(c):
        for r in range(per_client):
            # the prompt depends only on (client, request): every server gets the same ones
            prompt = f"Write two sentences about {TOPICS[(c * per_client + r) % len(TOPICS)]}."
            try:
                out = one_request(url, model, prompt, max_tokens, key)
                with lock:
                    results.append(out)
            except Exception as e:  # noqa: BLE001 - reported, the level goes on
                with lock:
                    errors.append(str(e))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    tokens = sum(r[2] for r in results)
    return {"clients": clients, "requests": len(results), "errors": len(errors), "wall_s": round(wall, 3),
            "requests_per_s": round(len(results) / wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "generated_tokens": tokens, "tokens_from": sorted({r[3] for r in results}),
            "ttft_p50_s": round(percentile(ttfts, 50), 4) if ttfts else None,
            "ttft_p99_s": round(percentile(ttfts, 99), 4) if ttfts else None,
            "first_error": errors[0] if errors else None}


def get_models(url, key, timeout=10):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key} if key else {})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET /v1/models: HTTP {resp.status}")
        return json.loads(body)["data"]
    finally:
        conn.close()


def free_port():
    # llama_cpp.server takes no port 0, so take one the kernel hands out and give it back
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=5):
    try:
        with open(path, errors="replace") as f:
            lines = [x.rstrip() for x in f if x.strip()]
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_meshkern(a, log_path):
    """(process, url): `meshkern serve` on a free port; it prints its URL when it listens."""
    log = open(log_path, "w")
    proc = subprocess.Popen([a.meshkern, "serve", a.model, "--port", "0", "--threads", str(a.threads),
                             "--max-sequences", str(a.max_sequences), "--ctx", str(a.ctx)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    url = None
    # a server that neither listens nor exits would hold the bench forever
    watchdog = threading.Timer(a.peer_timeout, proc.kill)
    watchdog.start()
    for line in proc.stdout:
        log.write(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    watchdog.cancel()
    if not url:
        stop(proc)
        log.close()
        raise RuntimeError(f"meshkern serve did not start (exit {proc.returncode}): {tail(log_path)}")

    # keep reading its stdout, or a full pipe would stall the server mid-bench
    def drain():
        for line in proc.stdout:
            log.write(line)
        log.close()
    threading.Thread(target=drain, daemon=True).start()
    return proc, url


def peer_missing():
    """Why llama-cpp-python's server cannot run here (None when it can), and its version."""
    r = subprocess.run([sys.executable, "-c", "import llama_cpp, uvicorn, llama_cpp.server.app; "
                        "print(llama_cpp.__version__)"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"llama-cpp-python[server] is not importable ({last}); pip install 'llama-cpp-python[server]'", None
    return None, r.stdout.strip()


def start_peer(a, log_path):
    """(process, url): llama-cpp-python's server on a free port, once /v1/models answers."""
    port = free_port()
    # --interrupt_requests False: by default a streamed answer is cut short when another request
    # waits for the model, which would count unfinished answers as done under load
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", a.model, "--n_threads", str(a.threads),
           "--n_threads_batch", str(a.threads), "--n_ctx", str(a.ctx), "--interrupt_requests", "False",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + a.peer_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{PEER} server exited ({proc.returncode}) before answering: {tail(log_path)}")
        try:
            get_models(url, None, timeout=2)
            return proc, url, cmd
        except (OSError, RuntimeError, ValueError, http.client.HTTPException):
            time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{PEER} server did not answer GET /v1/models within {a.peer_timeout} s: {tail(log_path)}")


def measure(url, a, levels_wanted, label, proc=None, log_path=None):
    """Every level against one running server; the first model it lists unless --model-name.
    A server started here that dies stops the measurement with its exit status and log."""
    def check_alive():
        if proc and proc.poll() is not None:
            how = f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else f"exit {proc.returncode}"
            raise RuntimeError(f"{label} server died ({how}): {tail(log_path)}")
    model = a.model_name or get_models(url, a.api_key)[0]["id"]
    try:
        one_request(url, model, "Say hello.", 4, a.api_key)  # warm-up: first-touch costs stay out of level 1
    except Exception:
        if proc:  # a crash closes the stream a moment before the process is gone
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        check_alive()
        raise
    levels = []
    for c in levels_wanted:
        levels.append(level(url, model, c, a.requests, a.max_tokens, a.api_key))
        print(f"{label}: " + json.dumps(levels[-1]), file=sys.stderr, flush=True)
        check_alive()
    return model, levels


def ratios(mine, peer):
    """meshkern / peer, per level both measured (>1 on tokens/s and requests/s: meshkern is faster;
    <1 on TTFT: meshkern answers sooner)."""
    by_clients = {lv["clients"]: lv for lv in peer}
    out = []
    for lv in mine:
        p = by_clients.get(lv["clients"])
        if not p:
            continue
        row = {"clients": lv["clients"]}
        for k in ("tokens_per_s", "requests_per_s", "ttft_p50_s"):
            row[k] = round(lv[k] / p[k], 3) if lv.get(k) and p.get(k) else None
        out.append(row)
    return out


def plot(doc, path):
    """tokens/s and TTFT p50/p99 against clients, every measured server, two panels in one PNG.
    Returns the path, or "skipped: why"."""
    series = {n: s["levels"] for n, s in doc["servers"].items() if isinstance(s, dict) and s.get("levels")}
    if not series:
        return "skipped: no server was measured"
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on a bench machine
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for i, (name, lv) in enumerate(series.items()):
            colour = f"C{i}"
            left.plot([x["clients"] for x in lv], [x["tokens_per_s"] for x in lv], "o-", color=colour, label=name)
            t = [x for x in lv if x["ttft_p50_s"] is not None]
            right.plot([x["clients"] for x in t], [x["ttft_p50_s"] for x in t], "o-", color=colour, label=f"{name} p50")
            right.plot([x["clients"] for x in t], [x["ttft_p99_s"] for x in t], "s--", color=colour, label=f"{name} p99")
        ticks = sorted({x["clients"] for lv in series.values() for x in lv})
        for ax, title, unit in ((left, "generated tokens/s", "tokens/s"), (right, "time to first token", "seconds")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(unit)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        left.set_ylim(bottom=0)
        fig.suptitle(doc["title"], fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    if not shutil.which("gnuplot"):
        return "skipped: neither matplotlib nor gnuplot is installed"
    names = list(series)
    data = "".join("\n".join(f"{x['clients']} {x['tokens_per_s']}" for x in series[n]) + "\ne\n" for n in names)
    ttft = ""
    for n in names:
        for k in ("ttft_p50_s", "ttft_p99_s"):
            ttft += "\n".join(f"{x['clients']} {x[k]}" for x in series[n] if x[k] is not None) + "\ne\n"
    ticks = ", ".join(str(t) for t in sorted({x["clients"] for lv in series.values() for x in lv}))
    script = (f"set terminal pngcairo noenhanced size 1100,460 font 'sans,9'\nset output '{path}'\n"
              f"set multiplot layout 1,2 title \"{doc['title']}\"\n"
              f"set logscale x 2\nset xtics ({ticks})\nset grid\nset key below\nset xlabel 'concurrent clients'\n"
              "set title 'generated tokens/s'\nset ylabel 'tokens/s'\nset yrange [0:*]\n"
              "plot " + ", ".join(f"'-' using 1:2 with linespoints lc {i + 1} title '{n}'" for i, n in enumerate(names))
              + "\n" + data +
              "set title 'time to first token'\nset ylabel 'seconds'\nset yrange [*:*]\n"
              "plot " + ", ".join(f"'-' using 1:2 with linespoints lc {i + 1} dt {1 + j} title '{n} {q}'"
                                  for i, n in enumerate(names) for j, q in enumerate(("p50", "p99")))
              + "\n" + ttft + "unset multiplot\n")
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if r.returncode != 0:
        return f"skipped: gnuplot failed ({r.stderr.strip()[:200]})"
    return path


def table(doc):
    rows = [f"{'server':<17} {'clients':>7} {'req/s':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'errors':>6}"]
    for name, s in doc["servers"].items():
        if not isinstance(s, dict):
            rows.append(f"{name:<17} {s}")
            continue
        for lv in s.get("levels", []):
            f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            rows.append(f"{name:<17} {lv['clients']:>7} {lv['requests_per_s']:>7.2f} {lv['tokens_per_s']:>7.1f} "
                        f"{f(lv['ttft_p50_s']):>9} {f(lv['ttft_p99_s']):>9} {lv['errors']:>6}")
        if s.get("error"):
            rows.append(f"{name:<17} FAILED: {s['error']}")
    for r in doc.get("ratios") or []:
        x = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
        rows.append(f"meshkern/{PEER} at {r['clients']} clients: tokens/s {x(r['tokens_per_s'])}, "
                    f"requests/s {x(r['requests_per_s'])}, TTFT p50 {x(r['ttft_p50_s'])}")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshkern", help="meshkern binary: start `meshkern serve` for the bench")
    ap.add_argument("--model", help="GGUF path (with --meshkern or --peer)")
    ap.add_argument("--url", help="an already running server instead of --meshkern")
    ap.add_argument("--peer", choices=["none", "llama-cpp"], default="none",
                    help="also start llama-cpp-python's server on --model and measure it the same way")
    ap.add_argument("--peer-timeout", type=float, default=180, help="seconds a server may take to start")
    ap.add_argument("--model-name", default=None, help="model id to send (default: each server's first)")
    ap.add_argument("--api-key", default=None, help="for --url (the servers started here have none)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each server")
    ap.add_argument("--ctx", type=int, default=1024, help="KV positions per sequence, both servers")
    ap.add_argument("--max-sequences", type=int, default=8, help="meshkern serve's sequences in flight")
    ap.add_argument("--clients", default="1,4,16,32", help="concurrency levels")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", help="also write the JSON here")
    ap.add_argument("--plot", help="write the PNG here")
    ap.add_argument("--log-dir", help="the servers' logs (default: a temporary folder)")
    a = ap.parse_args()
    if not (a.meshkern or a.url) or (a.meshkern and a.url):
        ap.error("one of --meshkern (with --model) or --url")
    if (a.meshkern or a.peer != "none") and not a.model:
        ap.error("--meshkern and --peer need --model")
    try:
        levels_wanted = [int(x) for x in a.clients.split(",") if x.strip()]
        assert levels_wanted and min(levels_wanted) > 0
    except (ValueError, AssertionError):
        ap.error("--clients: positive integers, comma-separated")
    logs = a.log_dir or tempfile.mkdtemp(prefix="serve_bench.")
    os.makedirs(logs, exist_ok=True)

    doc = {"title": f"{os.path.basename(a.model or a.url)}, {a.threads} threads, ctx {a.ctx}, {a.requests} requests "
                    f"per client of {a.max_tokens} tokens",
           "model": a.model, "threads": a.threads, "ctx": a.ctx, "max_tokens": a.max_tokens,
           "requests_per_client": a.requests, "clients": levels_wanted, "servers": {}, "ratios": []}
    failed = False
    # meshkern first, then the peer: one server at a time, each stopped before the next starts
    first = "meshkern" if a.meshkern else a.url
    entry = {"server": "meshkern serve" if a.meshkern else a.url}
    if a.meshkern:
        entry.update(max_sequences=a.max_sequences, log=os.path.join(logs, "meshkern.log"))
    proc = None
    try:
        url = a.url
        if a.meshkern:
            proc, url = start_meshkern(a, entry["log"])
        entry["model_id"], entry["levels"] = measure(url, a, levels_wanted, first, proc, entry.get("log"))
    except Exception as e:  # noqa: BLE001 - the JSON says what went wrong, the peer still runs
        entry["error"] = str(e)
        failed = True
    finally:
        stop(proc)
    doc["servers"][first] = entry

    if a.peer == "llama-cpp":
        why, version = peer_missing()
        if why:
            doc["servers"][PEER] = f"unavailable: {why}"
            print(f"serve_bench: {PEER} unavailable: {why}", file=sys.stderr)
        else:
            peer = {"server": "python3 -m llama_cpp.server", "llama_cpp_python": version,
                    "log": os.path.join(logs, "llama-cpp-python.log")}
            proc = None
            try:
                proc, url, cmd = start_peer(a, peer["log"])
                peer["command"] = " ".join(cmd)
                peer["model_id"], peer["levels"] = measure(url, a, levels_wanted, PEER, proc, peer["log"])
            except Exception as e:  # noqa: BLE001 - reported in the JSON
                peer["error"] = str(e)
                failed = True
            finally:
                stop(proc)
            doc["servers"][PEER] = peer
            if entry.get("levels") and peer.get("levels"):
                doc["ratios"] = ratios(entry["levels"], peer["levels"])

    for name, s in doc["servers"].items():
        for lv in s.get("levels", []) if isinstance(s, dict) else []:
            if lv["errors"]:
                failed = True
                print(f"serve_bench: {name} at {lv['clients']} clients: {lv['errors']} requests failed, "
                      f"first: {lv['first_error']}", file=sys.stderr)
    if a.plot:
        doc["plot"] = plot(doc, a.plot)
        if doc["plot"].startswith("skipped"):
            print(f"serve_bench: plot {doc['plot']}", file=sys.stderr)
    print(table(doc), file=sys.stderr)
    print(json.dumps(doc, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
