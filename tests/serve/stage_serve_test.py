#!/usr/bin/env python3
"""meshkern stage --serve (rank 0 of a process-per-range run) and IPv6, against real clients.

  stage_serve_test.py MESHKERN MODEL.gguf

Checks, with the `openai` package and curl:
  - rank 0 listens before the other rank joins: /health says "loading" (503), then "ok";
  - two processes answer exactly what one process (`meshkern run -p`) prints, streamed and not;
  - 5 clients at once over 2 slots (the rest queued) each get their own answer;
  - a streamed client that goes away frees its sequence within a step (metrics), and the
    freed slot serves the next request correctly; /metrics shows rank 0's busy time and steps
    and the bytes over seam 0, and the KV held and reserved;
  - SIGTERM drains: the request in flight finishes, a new one gets 503, both ranks exit 0;
  - a rank killed mid-answer: that answer ends with an error naming the lost rank, /health
    says "degraded" with the reason, new requests get 503, rank 0 exits 1 on SIGTERM;
  - usage errors (--serve with --prompts, a malformed address) exit 2;
  - meshkern serve --host ::1 answers over IPv6 (curl and the openai client).
"""
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

try:
    import openai
except ImportError:
    sys.exit("stage_serve_test: the `openai` Python package is missing (scripts/deps.sh installs it)")

BIN, MODEL = sys.argv[1], sys.argv[2]
KEY = "sk-meshkern-stage-key"
N = 8
PROMPTS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Say hello.",
           "Which animal barks?"]
MODEL_ID = os.path.basename(MODEL)[:-len(".gguf")]
LONG = "Write a long story about a dragon."
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def reference(prompt):
    """`meshkern run MODEL -p PROMPT`: (text, generated tokens)."""
    out = subprocess.run([BIN, "run", MODEL, "-p", prompt, "--max-tokens", str(N), "--threads", "1"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"^ranges:[^\n]*\n(.*)\n\[(end of turn|token limit)\] prompt \d+ tokens.*generated (\d+) tokens",
                  out, re.S | re.M)
    assert m, out
    return m.group(1), int(m.group(3))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process whose output is collected; `url` once it says where it listens."""

    def __init__(self, args, listens=False):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self.url = [], None
        if listens:
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    sys.exit("stage_serve_test: ended before listening:\n" + "".join(self.lines))
                self.lines.append(line)
                m = re.search(r"listening on (http://\S+)", line)
                if m:
                    self.url = m.group(1)
                    break
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def text(self):
        return "".join(self.lines)

    def client(self, key=KEY):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=180)


def curl(url, path, body=None, key=KEY):
    """(status, body bytes) from curl."""
    args = ["curl", "-g", "-s", "-w", "\n%{http_code}", "--max-time", "120"]
    if key:
        args += ["-H", "Authorization: Bearer " + key]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    out = subprocess.run(args + [url + path], capture_output=True, check=True).stdout
    body, _, status = out.rpartition(b"\n")
    return int(status), body


def metric(url, name):
    body = curl(url, "/metrics")[1].decode()
    m = re.search(r"^" + re.escape(name) + r" ([0-9.e+-]+)$", body, re.M)
    return float(m.group(1)) if m else None


def wait_for(cond, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline and not cond():
        time.sleep(0.05)
    return cond()


def stage_pair(extra0=(), extra1=()):
    """Rank 0 with --serve (started first: it listens while rank 1 is not there yet), then rank 1."""
    rdv = f"127.0.0.1:{free_port()}"
    common = ["--split", "14", "--world", "2", "--rendezvous", rdv, "--threads", "1", "--timeout", "20"]
    r0 = Proc([BIN, "stage", MODEL, "--rank", "0", *common, "--serve", "127.0.0.1:0", "--api-key", KEY, *extra0],
              listens=True)
    health = curl(r0.url, "/health", key=None)
    r1 = Proc([BIN, "stage", MODEL, "--rank", "1", *common, *extra1])
    ok = wait_for(lambda: curl(r0.url, "/health", key=None)[0] == 200, 60)
    if not ok:
        sys.exit("stage_serve_test: the stages did not come up:\n" + r0.text() + r1.text())
    return r0, r1, health


def main():
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        refs = list(pool.map(reference, PROMPTS))
    print(f"references: {time.time() - t0:.1f} s", flush=True)

    # ------------------------------------------------------------ a healthy run
    r0, r1, first_health = stage_pair(["--max-sequences", "2", "--max-queue", "8", "--ctx", "512"])
    try:
        status, body = first_health
        check(status == 503 and json.loads(body)["status"] == "loading",
              f"/health before rank 1 joins: {status} {body.decode()}")
        client = r0.client()
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=N)
        check(r.choices[0].message.content == refs[0][0] and r.usage.completion_tokens == refs[0][1],
              f"2 processes: openai chat equals one process's run -p ({refs[0][0]!r})")
        pieces = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=N, stream=True) if ch.choices]
        check("".join(pieces) == refs[1][0], "2 processes: streamed deltas join to run -p's answer")
        status, body = curl(r0.url, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": N})
        check(status == 200 and json.loads(body)["choices"][0]["message"]["content"] == refs[2][0],
              "2 processes: curl chat equals run -p")

        def ask(i):
            c = r0.client()
            r = c.chat.completions.create(model=MODEL_ID, max_tokens=N,
                                          messages=[{"role": "user", "content": PROMPTS[i]}])
            return r.choices[0].message.content, r.usage.completion_tokens
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(ask, range(len(PROMPTS))))
        wrong = [i for i, a in enumerate(answers) if a != refs[i]]
        check(not wrong, f"{len(PROMPTS)} clients at once over 2 slots each got their own answer (wrong: {wrong})")

        # a streamed client that goes away: its sequence is cut before its next step
        stream = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": LONG}],
                                                max_tokens=400, stream=True)
        it = iter(stream)
        next(it), next(it), next(it)
        check(metric(r0.url, "meshkern_sequences_in_flight") == 1, "a long stream is in flight")
        gen_before = metric(r0.url, "meshkern_generated_tokens_total")
        steps_before = metric(r0.url, 'meshkern_stage_steps_total{stage="0"}')
        stream.close()
        freed = wait_for(lambda: metric(r0.url, "meshkern_requests_cancelled_total") == 1 and
                         metric(r0.url, "meshkern_sequences_in_flight") == 0 and
                         metric(r0.url, 'meshkern_kv_sequences{kind="in_use"}') == 0)
        check(freed, "disconnect mid-stream: sequence cut, its KV free (metrics)")
        # The request ends for the server before the stage runtime has taken its blocks back
        # (that happens between steps): the pool must be whole within the deadline.
        def rank0_pool():
            return [metric(r0.url, f'meshkern_kv_blocks{{stage="0",kind="{kind}"}}')
                    for kind in ("capacity", "free", "promised")]
        wait_for(lambda: rank0_pool() == [64, 64, 0])
        pool = rank0_pool()
        check(pool == [64, 64, 0], f"metrics: rank 0's KV pool (a context of 512 in blocks of 16 per sequence in flight, "
                                   f"2), all back within 15 s: {pool}")
        steps_then = metric(r0.url, 'meshkern_stage_steps_total{stage="0"}')
        # the stage itself stopped the cut request (its token callback said so), not the server
        # alone: rank 0 ran a few steps after the disconnect, not the ~400 of max_tokens
        check(steps_then - steps_before < 50,
              f"the stage cut the request before its next step: {steps_then - steps_before} steps after the disconnect")
        time.sleep(1.0)  # nothing in flight: rank 0 runs no step (the cut sequence is gone, not running on)
        steps_now = metric(r0.url, 'meshkern_stage_steps_total{stage="0"}')
        check(steps_now == steps_then, f"after the cut rank 0 is idle: steps {steps_then} -> {steps_now}")
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[3]}],
                                           max_tokens=N)
        check(r.choices[0].message.content == refs[3][0], "the freed slot serves the next request correctly")
        check(metric(r0.url, "meshkern_generated_tokens_total") - gen_before < 100, "the cut stream stopped early")
        busy = metric(r0.url, 'meshkern_stage_busy_seconds_total{stage="0"}')
        steps = metric(r0.url, 'meshkern_stage_steps_total{stage="0"}')
        seam = metric(r0.url, 'meshkern_seam_bytes_total{seam="0"}')
        check(busy and busy > 0 and steps and steps >= 5 * N and seam and seam > steps * 576 * 2,
              f"metrics: rank 0 busy {busy} s over {steps} steps, {seam} bytes over seam 0")
        kv_cap = metric(r0.url, 'meshkern_kv_bytes{kind="capacity"}')
        # SmolLM2: 30 layers x 3 kv heads x 64 x 512 positions x K,V x 4 bytes, per sequence
        check(kv_cap == 2 * 30 * 3 * 64 * 512 * 2 * 4, f"metrics: KV reserved for 2 slots of 512 positions: {kv_cap}")

        # SIGTERM: the request in flight finishes, a new one gets 503, both ranks exit 0
        result = {}
        th = threading.Thread(target=lambda: result.update(r=curl(
            r0.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[4]}], "max_tokens": N})))
        th.start()
        wait_for(lambda: metric(r0.url, "meshkern_sequences_in_flight") == 1, 10)
        r0.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: curl(r0.url, "/health", key=None)[0] == 503, 10)
        status, body = curl(r0.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        check(status == 503 and b"shutting down" in body, f"draining: a new request gets {status}")
        th.join(60)
        status, body = result.get("r", (0, b"{}"))
        check(status == 200 and json.loads(body)["choices"][0]["message"]["content"] == refs[4][0],
              "draining: the request in flight finishes with its full answer")
        rc0, rc1 = r0.proc.wait(60), r1.proc.wait(60)
        check(rc0 == 0 and rc1 == 0 and "rank 1: done" in r1.text(), f"SIGTERM drain: rank 0 exit {rc0}, rank 1 exit {rc1}")
    finally:
        for p in (r0, r1):
            if p.proc.poll() is None:
                p.proc.kill()

    # --------------------------------------------------- a rank lost mid-answer
    r0, r1, _ = stage_pair(["--ctx", "512"])
    try:
        result = {}
        th = threading.Thread(target=lambda: result.update(r=curl(
            r0.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 400})))
        th.start()
        wait_for(lambda: (metric(r0.url, "meshkern_generated_tokens_total") or 0) > 0 or
                 (metric(r0.url, 'meshkern_stage_steps_total{stage="0"}') or 0) > 3, 20)
        r1.proc.kill()
        th.join(60)
        status, body = result.get("r", (0, b"{}"))
        err = json.loads(body).get("error", {}).get("message", "") if body.startswith(b"{") else ""
        check(status == 500 and "rank 1" in err, f"rank 1 killed mid-answer: {status} {err[:160]!r}")
        status, body = curl(r0.url, "/health", key=None)
        h = json.loads(body)
        check(status == 503 and h["status"] == "degraded" and "rank 1" in h.get("reason", ""),
              f"/health after the loss: {status} {h}")
        status, body = curl(r0.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        check(status == 503 and b"rank 1" in body, f"a new request after the loss: {status}")
        r0.proc.send_signal(signal.SIGTERM)
        rc0 = r0.proc.wait(60)
        check(rc0 == 1, f"rank 0 exits 1 after a failed run ({rc0})")
    finally:
        for p in (r0, r1):
            if p.proc.poll() is None:
                p.proc.kill()

    # ------------------------------------------------------------ usage errors
    rdv = f"127.0.0.1:{free_port()}"
    base = [BIN, "stage", MODEL, "--split", "14", "--rank", "0", "--world", "2", "--rendezvous", rdv]
    for name, extra, want in [("--serve with --prompts", ["--serve", "127.0.0.1:0", "--prompts", "-"], "one or the other"),
                              ("--serve without a port", ["--serve", "127.0.0.1"], "HOST:PORT"),
                              ("--serve with a name", ["--serve", "localhost:80"], "not an IPv4 or IPv6 address")]:
        p = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and want in p.stderr, f"usage error, {name}: exit {p.returncode} {p.stderr.strip()!r}")

    # ------------------------------------------------------------------ IPv6
    v6 = Proc([BIN, "serve", MODEL, "--host", "::1", "--port", "0", "--threads", "1", "--ctx", "256"], listens=True)
    try:
        check(v6.url.startswith("http://[::1]:"), f"serve --host ::1 listens on {v6.url}")
        status, body = curl(v6.url, "/health", key=None)
        check(status == 200, "IPv6: curl /health")
        r = openai.OpenAI(base_url=v6.url + "/v1", api_key="none", max_retries=0, timeout=120).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=N)
        check(r.choices[0].message.content == refs[0][0], "IPv6: openai chat equals run -p")
        v6.proc.send_signal(signal.SIGTERM)
        check(v6.proc.wait(30) == 0, "IPv6 server: SIGTERM -> exit 0")
    finally:
        if v6.proc.poll() is None:
            v6.proc.kill()

    print(f"stage serve test: {time.time() - t0:.1f} s, {len(failures)} failure(s)")
    if failures:
        print("--- rank 0:\n" + r0.text()[-3000:] + "\n--- rank 1:\n" + r1.text()[-2000:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
