#!/usr/bin/env python3
"""A random-weight Llama whose widths are multiples of 256, quantized to Q4_K_M by llama.cpp:
a model for timing the cpu backend's K-quant kernels end to end (SmolLM2, the project's
model, cannot be stored in K-quants: its 576 columns are not a multiple of 256).

    python3 scripts/make_kquant_model.py OUT.gguf [--hidden 1024] [--ffn 2816] [--layers 8] [--ftype q4_k_m]

Shape: hidden 1024 (16 heads of 64, 4 key/value heads), SwiGLU 2816, 8 layers, SmolLM2's
tokenizer and vocabulary (49152; its tokenizer.* keys copied from models/, so the prompt ids of
bench/batch_bench.py mean the same), an untied output matrix. Weights are normal with scale
1/sqrt(fan-in) (seed 7), written as F16 by the gguf package, then quantized with
llama_model_quantize (LLAMA_FTYPE_MOSTLY_Q4_K_M: Q4_K for most matrices, Q6_K for the output
matrix and some value/down projections; `--ftype q4_0`, `q8_0`, `q2_k` or `q3_k_m` for those mixes instead,
llama.cpp choosing the output matrix's format as it does for them). Needs the PyPI packages gguf, numpy and
llama-cpp-python (bench tools, never the test path). The tokens it generates are noise.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# llama.cpp's llama_ftype values for the mixes --ftype offers.
LLAMA_FTYPES = {"q4_0": 2, "q8_0": 7, "q2_k": 10, "q3_k_m": 12, "q4_k_m": 15}


def copy_tokenizer(reader, writer, gguf):
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(name, values, kind, sub_type=sub)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]).decode(), kind)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)


def write_f16(path, hidden, ffn, layers, gguf):
    heads, kv_heads = hidden // 64, max(1, hidden // 256)
    head_dim, vocab = hidden // heads, 49152
    w = gguf.GGUFWriter(path, "llama")
    copy_tokenizer(gguf.GGUFReader(SOURCE), w, gguf)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1)  # F16
    rng = np.random.default_rng(7)

    def matrix(name, rows, cols):
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * cols ** -0.5).astype(np.float16))

    matrix("token_embd.weight", vocab, hidden)
    for layer in range(layers):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        matrix(p + "attn_q.weight", hidden, hidden)
        matrix(p + "attn_k.weight", kv_heads * head_dim, hidden)
        matrix(p + "attn_v.weight", kv_heads * head_dim, hidden)
        matrix(p + "attn_output.weight", hidden, hidden)
        matrix(p + "ffn_gate.weight", ffn, hidden)
        matrix(p + "ffn_up.weight", ffn, hidden)
        matrix(p + "ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    matrix("output.weight", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ftype", choices=sorted(LLAMA_FTYPES), default="q4_k_m", help="llama.cpp's quantization mix")
    a = ap.parse_args()
    if a.hidden % 256 or a.ffn % 256 or a.hidden % 64:
        ap.error("--hidden and --ffn must be multiples of 256 (K-quant super-blocks)")
    try:
        import gguf
        import llama_cpp
    except ImportError as e:
        sys.exit(f"make_kquant_model.py: needs the PyPI packages gguf and llama-cpp-python ({e})")
    if not os.path.exists(SOURCE):
        sys.exit(f"make_kquant_model.py: {SOURCE} is missing (scripts/fetch_model.sh fetches it)")
    f16 = a.out + ".f16.tmp"
    try:
        write_f16(f16, a.hidden, a.ffn, a.layers, gguf)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = LLAMA_FTYPES[a.ftype]
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(f16.encode(), a.out.encode(), params)
        if rc != 0:
            sys.exit(f"make_kquant_model.py: llama_model_quantize returned {rc}")
    finally:
        if os.path.exists(f16):
            os.remove(f16)
    print(a.out)


if __name__ == "__main__":
    main()
