#!/usr/bin/env python3
"""gil_bench.py - do two Python threads driving two meshkern ranges run in parallel?

cffi releases the GIL around every C call, so two threads that each run forward passes
on their own range should take about half the serial time on two free cores. The suite
checks the mechanism without a clock (python/tests/test_binding.py: another thread makes
progress inside one forward call; a blocking accept lets the connecting thread run);
this program measures the overlap, with the same work in two processes as the control
(no GIL at all): when the processes cannot overlap either, the cores were busy.

    MESHKERN_LIB=build/host/libmeshkern.so python3 bench/gil_bench.py [--passes N] [--repeat R] [--json F]

Prints the thread ratio, the process ratio and their quotient (1.00: threads overlap as
well as processes). Needs the meshkern Python package (pip install ./python).
"""
import argparse
import json
import subprocess
import sys
import threading
import time

MODEL = dict(seed=3, vocab=2048, hidden=512, n_heads=8, n_kv_heads=8, head_dim=64, intermediate=1536,
             max_context=512, n_layers=4)

_PROC = """
import sys, time, meshkern as mk
m = mk.Model.random(**%r)
r = mk.Range(m, 0, 1, threads=1, max_context=256)
s = r.sequence()
def once():
    s.reset()
    s.forward(list(range(128)))
once()
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    once()
print(time.perf_counter() - t0)
""" % (MODEL,)


def forward_loop(rng, n):
    s = rng.sequence()
    for _ in range(n):
        s.reset()
        s.forward(list(range(128)))


def thread_ratio(mk, n):
    m = mk.Model.random(**MODEL)
    a = mk.Range(m, 0, 1, threads=1, max_context=256)
    b = mk.Range(m, 0, 1, threads=1, max_context=256)
    forward_loop(a, 1), forward_loop(b, 1)          # warm
    t0 = time.perf_counter()
    forward_loop(a, n)
    forward_loop(b, n)
    serial = time.perf_counter() - t0
    ts = [threading.Thread(target=forward_loop, args=(x, n)) for x in (a, b)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return (time.perf_counter() - t0) / serial


def process_ratio(n):
    def start():
        p = subprocess.Popen([sys.executable, "-c", _PROC, str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("gil_bench: the control process did not start")
        return p

    def go(p):
        p.stdin.write("go\n")
        p.stdin.flush()

    one = start()
    go(one)
    alone = float(one.communicate()[0])
    a = start()
    try:
        b = start()
    except BaseException:
        a.kill()
        raise
    go(a), go(b)
    both = max(float(a.communicate()[0]), float(b.communicate()[0]))
    return both / (2 * alone)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=3, help="forward passes of 128 tokens per thread")
    ap.add_argument("--repeat", type=int, default=3, help="measurements; the best is reported")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.passes < 1 or args.repeat < 1:
        ap.error("--passes and --repeat take 1 or more")
    import meshkern as mk

    threads = min(thread_ratio(mk, args.passes) for _ in range(args.repeat))
    procs = min(process_ratio(args.passes) for _ in range(args.repeat))
    out = {"passes": args.passes, "repeat": args.repeat, "thread_ratio": round(threads, 3),
           "process_ratio": round(procs, 3), "threads_vs_processes": round(threads / procs, 3)}
    print(f"two threads, two ranges:     {threads:.2f}x the serial time (best of {args.repeat})")
    print(f"two processes (no GIL):      {procs:.2f}x")
    print(f"threads / processes:         {threads / procs:.2f} (1.00: the GIL costs nothing)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
