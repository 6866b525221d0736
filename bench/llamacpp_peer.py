#!/usr/bin/env python3
"""llama.cpp decode speed on a GGUF, measured the way bench/e2e_bench measures meshkern.

Same model file, the same prompt token ids ((i * 7919 + 13) mod vocab, as e2e_bench makes
them, or --prompt-ids), the same thread count; greedy decode (argmax over the last logits
row) of --tokens tokens after a prefill that is not timed; the first run warms up, the
median decode tokens/s of --runs runs is reported. One JSON object goes to stdout (and to
--json PATH when given).

    python3 bench/llamacpp_peer.py MODEL.gguf --threads 2 --tokens 128 --runs 3 --json OUT

Needs llama-cpp-python (PyPI); bench/run.sh installs it. Each step is one llama_decode
through Llama.eval plus an argmax in Python, a few tens of microseconds per token.
Exit: 0 ok; 3 llama-cpp-python missing (the JSON says so).
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
    ap.add_argument("--prompt-ids", default="", help="comma-separated token ids")
    ap.add_argument("--prompt-len", type=int, default=128, help="e2e_bench's prompt of this length")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args()

    def emit(doc):
        text = json.dumps(doc)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")

    try:
        import numpy as np
        import llama_cpp
    except ImportError as e:
        emit({"error": f"llama-cpp-python is not installed: {e}"})
        return 3

    llm = None
    n_ctx = 8
    try:
        # n_ctx must hold the prompt; the vocabulary is known only once the model is open,
        # so open it with room for the longest prompt asked for.
        n_prompt = len([t for t in args.prompt_ids.split(",") if t]) or args.prompt_len
        n_ctx = n_prompt + args.tokens + 8
        llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads, n_threads_batch=args.threads,
                              n_ctx=n_ctx, n_batch=max(n_prompt, 32), logits_all=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - any load failure is reported, not raised
        emit({"error": f"llama.cpp cannot load {args.model}: {e}"})
        return 1
    n_vocab = llm.n_vocab()
    if args.prompt_ids:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t]
    else:
        prompt = [(i * 7919 + 13) % n_vocab for i in range(args.prompt_len)]

    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    runs, argmax_s, last_tokens = [], [], []
    for _ in range(args.runs + 1):
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
        runs.append(args.tokens / (time.perf_counter() - t0))
        argmax_s.append(spent_argmax)
        last_tokens.append(token)
    runs, argmax_s = runs[1:], argmax_s[1:]
    emit({
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
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
