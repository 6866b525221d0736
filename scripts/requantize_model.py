#!/usr/bin/env python3
"""The project's model requantized by llama.cpp into another of its mixes: a real model in the
formats users download, for timing the cpu backend on them (bench tools, never the test path).

    python3 scripts/requantize_model.py OUT.gguf [--ftype q4_k_m] [--source models/SmolLM2-135M-Instruct.Q4_1.gguf]

llama_model_quantize with allow_requantize: the source's weights are dequantized and quantized
again, so the values carry both roundings (the tokens differ from the original model's), but
the mix of formats is llama.cpp's own for the model's shapes. For SmolLM2 (576 columns, not a
multiple of 256) Q4_K_M falls back to Q5_0 for most matrices: Q5_0 166, Q4_K 16, Q6_K 14,
Q8_0 15 (the tied embedding among them). Needs llama-cpp-python.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# llama.cpp's llama_ftype values for the mixes offered.
LLAMA_FTYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18,
                "iq4_nl": 25, "iq4_xs": 30}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ftype", choices=sorted(LLAMA_FTYPES), default="q4_k_m", help="llama.cpp's quantization mix")
    ap.add_argument("--source", default=SOURCE, help="the GGUF to requantize")
    a = ap.parse_args()
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[a.ftype]
    params.nthread = os.cpu_count() or 1
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(a.source.encode(), a.out.encode(), params)
    if rc != 0:
        sys.exit(f"requantize_model.py: llama_model_quantize returned {rc}")
    print(a.out)


if __name__ == "__main__":
    main()
