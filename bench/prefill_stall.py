#!/usr/bin/env python3
"""How long one long prompt stalls the streams beside it, per --prefill-chunk.

    python3 bench/prefill_stall.py --meshkern build/tools/meshkern --model MODEL.gguf \\
        --chunks 0,64,128,256 --prompt-words 1900 --threads 1 [--json out.json]

For each chunk size: `meshkern serve MODEL --prefill-chunk C` on a free port; one client
streams a 400-token completion; one second in, a second client sends a prompt of
--prompt-words words (max_tokens 1). Printed per chunk: the long prompt's answer time and
the stream's longest and median gap between chunks. With chunk 0 the whole prompt is one
step and the stream waits for all of it; with chunk C the stream gets a step between every
two chunks. One server at a time. Exit 0 measured, 1 a server or request failed.
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request


def measure(binary, model, chunk, words, threads):
    proc = subprocess.Popen([binary, "serve", model, "--port", "0", "--threads", str(threads), "--prefill-chunk",
                             str(chunk)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            raise RuntimeError("the server ended before listening")

        def post(body):
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            return urllib.request.urlopen(req, timeout=600)

        gaps = []

        def stream():
            last = time.time()
            for line in post({"prompt": "Once upon a time", "max_tokens": 400, "stream": True}):
                if line.startswith(b"data: "):
                    now = time.time()
                    gaps.append(now - last)
                    last = now

        th = threading.Thread(target=stream)
        th.start()
        time.sleep(1.0)
        t0 = time.time()
        post({"prompt": "word " * words, "max_tokens": 1}).read()
        long_s = time.time() - t0
        th.join()
        gaps.sort()
        return {"chunk": chunk, "long_prompt_s": round(long_s, 3), "stream_longest_gap_s": round(gaps[-1], 3),
                "stream_median_gap_ms": round(1000 * gaps[len(gaps) // 2], 2)}
    finally:
        proc.terminate()
        proc.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meshkern", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--chunks", default="0,64,128,256")
    ap.add_argument("--prompt-words", type=int, default=1900)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    try:
        for c in [int(x) for x in a.chunks.split(",")]:
            r = measure(a.meshkern, a.model, c, a.prompt_words, a.threads)
            rows.append(r)
            print(f"chunk {c:>4}: long prompt {r['long_prompt_s']:.2f} s; the stream's longest gap "
                  f"{r['stream_longest_gap_s']:.2f} s, median {r['stream_median_gap_ms']:.1f} ms", flush=True)
    except Exception as e:  # a server or request failed: say which
        print(f"prefill_stall: {e}", file=sys.stderr)
        return 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "prompt_words": a.prompt_words, "levels": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
