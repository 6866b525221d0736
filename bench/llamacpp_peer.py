#!/usr/bin/env python3
"""llama.cpp decode speed on a GGUF, measured the way bench/e2e_bench measures meshkern.

Same model file, the same prompt token ids, the same thread count; greedy decode (argmax
over the full logits row, as meshkern's tail does) of N tokens after a prefill that is not
timed; the run is repeated and the median decode tokens/s reported. One JSON object goes to
stdout; e2e_bench runs this script and reads it.

    python3 bench/llamacpp_peer.py MODEL.gguf --threads 2 --tokens 128 --runs 3 \\
        --prompt-ids 13,7932,...

Uses llama-cpp-python (PyPI llama-cpp-python), which builds llama.cpp from source for this
CPU. Each decode step is one llama_decode call through Llama.eval plus a NumPy argmax over
the logits row llama.cpp wrote: Python adds some tens of microseconds per token; the time
in argmax is reported separately (argmax_s) so the comparison can be judged.
"""
import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="decoded tokens per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-ids", default="", help="comma-separated token ids (default: 1)")
    args = ap.parse_args()

    try:
        import numpy as np
        import llama_cpp
    except ImportError as e:  # the caller reports the peer as unavailable
        print(json.dumps({"error": f"llama-cpp-python is not installed: {e}"}))
        return 3

    prompt = [int(t) for t in args.prompt_ids.split(",") if t] or [1]
    n_ctx = len(prompt) + args.tokens + 8
    llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads, n_threads_batch=args.threads,
                          n_ctx=n_ctx, n_batch=max(len(prompt), 32), logits_all=False, verbose=False)

    n_vocab = llm.n_vocab()

    def last_logits():
        # Only the last token of each batch has logits (logits_all=False): read that row
        # where llama.cpp wrote it, without a copy.
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    runs, argmax_s, last_tokens = [], [], []
    for _ in range(args.runs + 1):  # the first run warms up and is not counted
        llm.reset()
        llm.eval(prompt)
        token = int(np.argmax(last_logits()))
        spent_argmax = 0.0
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            llm.eval([token])
            a0 = time.perf_counter()
            token = int(np.argmax(last_logits()))
            spent_argmax += time.perf_counter() - a0
        elapsed = time.perf_counter() - t0
        runs.append(args.tokens / elapsed)
        argmax_s.append(spent_argmax)
        last_tokens.append(token)
    runs, argmax_s = runs[1:], argmax_s[1:]
    print(json.dumps({
        "engine": "llama.cpp",
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "model": args.model,
        "threads": args.threads,
        "prompt_tokens": len(prompt),
        "decode_tokens": args.tokens,
        "decode_tps_runs": [round(r, 3) for r in runs],
        "decode_tps_median": round(statistics.median(runs), 3),
        "argmax_s": [round(a, 5) for a in argmax_s],
        "last_token": last_tokens[-1],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
