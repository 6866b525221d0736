#!/usr/bin/env python3
"""Dequantization fixtures for meshkern's GGUF reader, produced by an independent
implementation: the PyPI `gguf` package (GGUFReader, gguf.quants, GGUFWriter).

Writes to tests/fixtures/dequant/ (committed; about 100 KB in all):

  smollm2_manifest.txt   one line per slice of the default model (SmolLM2-135M-Instruct
                         Q4_1): `tensor type dims0 dims1 row_start n_rows data_offset file`
  smollm2_<n>.f32        those rows dequantized by gguf.quants.dequantize (float32 LE).
                         One slice per tensor type present in the model (F32, Q4_1,
                         Q8_0), first and last rows so that offsets are exercised.
  synthetic.gguf         a tiny GGUF v3 written by gguf.GGUFWriter: one [2, 256] tensor per
                         type meshkern dequantizes (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
                         Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS) and metadata of every value type.
                         Block types the package can quantize are made with
                         gguf.quants.quantize from seeded random floats; K-quants and IQ4_NL,
                         IQ4_XS (which it only dequantizes) are seeded random block bytes with
                         finite f16 scales. F16/BF16 include zeros, subnormals, infinities.
  synthetic_<TYPE>.f32   each synthetic tensor read back with GGUFReader and dequantized
                         by gguf.quants.dequantize (float32 LE).
  synthetic_manifest.txt `tensor type n_elements file`

Usage: python3 scripts/make_dequant_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
Requires: pip install gguf numpy
"""
import argparse
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "dequant")

# (tensor, first row, number of rows): one slice per type in the model, plus tail rows.
SMOLLM2_SLICES = [
    ("blk.0.attn_norm.weight", 0, 1),      # F32 [576]
    ("output_norm.weight", 0, 1),          # F32 [576]
    ("token_embd.weight", 0, 2),           # Q8_0 [49152, 576]: first rows
    ("token_embd.weight", 49150, 2),       # Q8_0: last rows (end of the tensor)
    ("blk.0.attn_q.weight", 0, 4),         # Q4_1 [576, 576]
    ("blk.0.attn_k.weight", 188, 4),       # Q4_1 [192, 576]: last rows
    ("blk.29.ffn_down.weight", 572, 4),    # Q4_1 [576, 1536]: last tensor's last rows
]

SYNTH_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
ROW = 256   # elements per row: one K-quant block, eight 32-blocks
ROWS = 2

# byte offsets of the f16 scale fields inside one K-quant block
K_SCALE_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
                  "IQ4_NL": (0,), "IQ4_XS": (0,)}


def write_f32(path, arr):
    np.ascontiguousarray(arr, dtype="<f4").tofile(path)


def smollm2(model):
    r = gguf.GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    lines = []
    for i, (name, row0, nrows) in enumerate(SMOLLM2_SLICES):
        t = by_name[name]
        dims = [int(d) for d in t.shape]          # fastest first, as in the file
        row = dims[0]
        raw = np.asarray(t.data)                  # [rows, bytes_per_row] or [rows, row] floats
        if t.tensor_type == T.F32:
            vals = raw.reshape(-1)[row0 * row:(row0 + nrows) * row].astype(np.float32)
        else:
            raw = raw.reshape(-1, raw.shape[-1])
            vals = dequantize(raw[row0:row0 + nrows], t.tensor_type).reshape(-1).astype(np.float32)
        assert vals.size == nrows * row
        fname = "smollm2_%d.f32" % i
        write_f32(os.path.join(OUT, fname), vals)
        d1 = dims[1] if len(dims) > 1 else 1
        lines.append("%s %s %d %d %d %d %d %s" % (name, t.tensor_type.name, dims[0], d1, row0, nrows,
                                                 int(t.data_offset), fname))
    with open(os.path.join(OUT, "smollm2_manifest.txt"), "w") as f:
        f.write("# tensor type dims0 dims1 row_start n_rows file_data_offset file  "
                "(made by scripts/make_dequant_fixtures.py with gguf %s)\n" % gguf_version())
        f.write("\n".join(lines) + "\n")
    types = sorted({t.tensor_type.name for t in r.tensors})
    print("model tensor types:", " ".join(types))


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "?"


def synthetic_tensor(name, rng):
    x = (rng.standard_normal((ROWS, ROW)) * 0.5).astype(np.float32)
    if name == "F32":
        x[0, :4] = [0.0, -0.0, np.float32(1e-40), np.inf]
        return x, None
    if name in ("F16", "BF16"):
        qt = T.F16 if name == "F16" else T.BF16
        if name == "F16":
            x[0, :6] = [0.0, -0.0, 6e-8, -3e-6, 65504.0, -np.inf]   # zeros, subnormals, max, -inf
            data = x.astype(np.float16)
            return data, None
        x[0, :5] = [0.0, -0.0, np.float32(1e-39), -np.inf, 3.0e38]
        return quantize(x, qt), qt
    qt = T[name]
    if name in K_SCALE_FIELDS:
        block_size, type_size = gguf.constants.GGML_QUANT_SIZES[qt]
        nb = ROWS * ROW // block_size
        blocks = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
        for b in range(nb):
            for off in K_SCALE_FIELDS[name]:
                blocks[b, off:off + 2] = np.frombuffer(
                    np.float16(rng.uniform(0.001, 0.05)).tobytes(), dtype=np.uint8)
        return blocks.reshape(ROWS, -1), qt
    return quantize(x, qt), qt


def synthetic():
    rng = np.random.default_rng(20240611)
    path = os.path.join(OUT, "synthetic.gguf")
    w = gguf.GGUFWriter(path, arch="meshkern-test")
    # metadata of every value type (read back by the C test)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo")
    w.add_uint64("test.u64", 2**40 + 3)
    w.add_int64("test.i64", -(2**40) - 3)
    w.add_float64("test.f64", 0.1)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_str", ["a", "bc", ""])
    for name in SYNTH_TYPES:
        data, qt = synthetic_tensor(name, rng)
        if qt is None:
            w.add_tensor("t." + name, data)
        else:
            w.add_tensor("t." + name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(path)
    lines = []
    for t in r.tensors:
        tname = t.tensor_type.name
        vals = dequantize(np.asarray(t.data), t.tensor_type).reshape(-1).astype(np.float32)
        assert vals.size == ROWS * ROW, (t.name, vals.size)
        fname = "synthetic_%s.f32" % tname
        write_f32(os.path.join(OUT, fname), vals)
        lines.append("%s %s %d %s" % (t.name, tname, vals.size, fname))
    with open(os.path.join(OUT, "synthetic_manifest.txt"), "w") as f:
        f.write("# tensor type n_elements file  (made by scripts/make_dequant_fixtures.py "
                "with gguf %s)\n" % gguf_version())
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if not os.path.exists(args.model):
        sys.exit("model not found: %s (run scripts/fetch_model.sh first)" % args.model)
    smollm2(args.model)
    synthetic()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print("wrote %s (%d bytes)" % (OUT, total))


if __name__ == "__main__":
    main()
