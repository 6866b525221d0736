#!/usr/bin/env python3
"""A user-space wire between two network namespaces, for the impairment harness
(impair_stage_test.sh): a TUN device in each namespace (point-to-point, made by the
harness), and this process copying every IP packet from one to the other after a one-way
delay. The kernel here has no netem; this is the delay line instead.

  impair_wire.py NS_A TUN_A NS_B TUN_B CONTROL_FILE

CONTROL_FILE holds one line, re-read every 50 ms: "delay_ms hold_percent hold_ms cut"
(e.g. "10 1 200 0"). A packet leaves delay_ms after it arrived; hold_percent of them are
held hold_ms more, and the packets behind a held one wait for it (a stalled link keeps
its order); with cut = 1 every packet is dropped (a cut cable: no reset, no close, only
silence). Rate limits are the harness's (tc tbf on the TUN devices). Prints, at SIGTERM,
the packets forwarded, held and dropped.
"""
import ctypes
import fcntl
import heapq
import os
import random
import select
import signal
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
libc = ctypes.CDLL(None, use_errno=True)


def open_tun(ns, name):
    """Open the TUN device `name` made in namespace `ns` (TUNSETIFF looks it up there)."""
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(there, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        os.set_blocking(fd, False)
        return fd
    finally:
        libc.setns(here, CLONE_NEWNET)
        os.close(here)
        os.close(there)


def main():
    ns_a, tun_a, ns_b, tun_b, control = sys.argv[1:6]
    fds = [open_tun(ns_a, tun_a), open_tun(ns_b, tun_b)]
    rng = random.Random(23)
    settings = [0.0, 0.0, 0.0, 0]
    last_read = 0.0
    queue = []          # (release time, sequence, out fd, packet)
    last_release = {fds[0]: 0.0, fds[1]: 0.0}
    counts = {"forwarded": 0, "held": 0, "dropped": 0}
    seq = 0

    def report(*_):
        print(" ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    while True:
        now = time.monotonic()
        if now - last_read > 0.05:
            try:
                with open(control) as f:
                    d, hp, hm, cut = f.read().split()
                settings = [float(d) / 1000.0, float(hp), float(hm) / 1000.0, int(cut)]
            except (OSError, ValueError):
                pass
            last_read = now
        timeout = 0.05
        if queue:
            timeout = max(0.0, min(timeout, queue[0][0] - now))
        ready, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            out = fds[1] if fd == fds[0] else fds[0]
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if settings[3]:
                    counts["dropped"] += 1
                    continue
                release = now + settings[0]
                if settings[1] > 0 and rng.random() * 100.0 < settings[1]:
                    release += settings[2]
                    counts["held"] += 1
                release = max(release, last_release[out])  # in order: behind a held packet
                last_release[out] = release
                seq += 1
                heapq.heappush(queue, (release, seq, out, packet))
        while queue and queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(queue)
            if settings[3]:
                counts["dropped"] += 1
                continue
            try:
                os.write(out, packet)
                counts["forwarded"] += 1
            except OSError:
                counts["dropped"] += 1


if __name__ == "__main__":
    main()
