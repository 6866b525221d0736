#!/usr/bin/env python3
"""Load on an OpenAI-compatible server: requests/s, tokens/s and time to first token.

    python3 bench/serve_bench.py --meshkern build/tools/meshkern --model MODEL.gguf --threads 2
    python3 bench/serve_bench.py --url http://127.0.0.1:8000 --model-name NAME   (any server,
        e.g. python -m llama_cpp.server --model MODEL.gguf --n_threads 2, for comparison)

With --meshkern the bench starts `meshkern serve` on a free port and stops it after. For each
concurrency level (--clients 1,4,8) that many clients each send --requests streamed chat
requests one after another (distinct prompts, greedy, --max-tokens each, stop strings off)
after one warm-up request. Per level: requests/s and generated tokens/s over the level's wall
time, and time to first token (first non-empty content chunk) p50/p99 over its requests.
Generated tokens are the server's usage counts (stream_options.include_usage). Standard
library only: the HTTP client is http.client, so the client adds little of its own time.
One JSON object goes to stdout (and to --json PATH).
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

TOPICS = ["the sea", "a city at night", "a mountain", "winter", "a library", "a train journey", "bread",
          "the moon", "a garden", "rain", "a lighthouse", "music", "an old map", "a river", "a market", "snow"]


def one_request(url, model, prompt, max_tokens, key):
    """(seconds to the first text, total seconds, completion tokens) of one streamed chat."""
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
    ttft, tokens = None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for ch in chunk.get("choices") or []:
            if ttft is None and (ch.get("delta", {}).get("content") or ""):
                ttft = time.perf_counter() - t0
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    conn.close()
    return ttft if ttft is not None else total, total, tokens


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]


def level(url, model, clients, per_client, max_tokens, key):
    results, errors, lock = [], [], threading.Lock()

    def client(c):
        for r in range(per_client):
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
            "generated_tokens": tokens,
            "ttft_p50_s": round(percentile(ttfts, 50), 4) if ttfts else None,
            "ttft_p99_s": round(percentile(ttfts, 99), 4) if ttfts else None,
            "first_error": errors[0] if errors else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshkern", help="meshkern binary: start `meshkern serve` for the bench")
    ap.add_argument("--model", help="GGUF path (with --meshkern)")
    ap.add_argument("--url", help="an already running server instead")
    ap.add_argument("--model-name", default=None, help="model id to send (default: the server's first)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-sequences", type=int, default=8)
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=3, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", help="also write the JSON here")
    a = ap.parse_args()
    proc = None
    url = a.url
    if a.meshkern:
        proc = subprocess.Popen([a.meshkern, "serve", a.model, "--port", "0", "--threads", str(a.threads),
                                 "--max-sequences", str(a.max_sequences), "--ctx", "1024"],
                                stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            sys.exit("serve_bench: the server did not start")
    elif not url:
        sys.exit("serve_bench: --meshkern and --model, or --url")
    try:
        u = urllib.parse.urlparse(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer " + a.api_key} if a.api_key else {})
        model = a.model_name or json.loads(conn.getresponse().read())["data"][0]["id"]
        conn.close()
        one_request(url, model, "Say hello.", 4, a.api_key)  # warm-up
        levels = []
        for c in [int(x) for x in a.clients.split(",")]:
            levels.append(level(url, model, c, a.requests, a.max_tokens, a.api_key))
            print(json.dumps(levels[-1]), file=sys.stderr, flush=True)
        out = {"server": "meshkern serve" if proc else url, "model": model, "threads": a.threads,
               "max_tokens": a.max_tokens, "requests_per_client": a.requests, "levels": levels}
        print(json.dumps(out, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
