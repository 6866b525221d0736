"""Write a dense-Llama GGUF file (F32 tensors) from named numpy arrays.

The C API has no entry point for a model built from caller-supplied weights; it opens
GGUF files. :func:`write_gguf` writes one (the C library only *reads* GGUF, so this is
not a second implementation of anything it does) and :meth:`meshkern.Model.from_arrays`
opens it with ``mk_model_open_gguf``.

Tensor names are the GGUF llama names (``token_embd.weight``, ``blk.N.attn_q.weight``,
..., ``output_norm.weight``, ``output.weight``), weights [out, in] as in PyTorch. GGUF
llama models use the adjacent-pairs RoPE layout; weights of a rotate-half (Hugging Face)
model are converted by permuting the rows of Q and K within each head, as llama.cpp's
converter does (``rope_layout="rotate_half"``).
"""

from __future__ import annotations

import struct
from typing import Mapping

import numpy as np

_ALIGN = 32
_T_UINT32, _T_FLOAT32, _T_STRING = 4, 6, 8


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value) -> bytes:
    out = _s(key) + struct.pack("<I", vtype)
    if vtype == _T_UINT32:
        return out + struct.pack("<I", int(value))
    if vtype == _T_FLOAT32:
        return out + struct.pack("<f", float(value))
    return out + _s(str(value))


def rotate_half_to_adjacent(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Permute Q/K rows of a rotate-half model for the adjacent-pairs layout."""
    w = np.asarray(w)
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: str, tensors: Mapping[str, np.ndarray], *, n_heads: int, n_kv_heads: int | None = None,
               rms_eps: float = 1e-6, rope_theta: float = 10000.0, max_context: int = 256,
               rope_layout: str = "adjacent_pairs", name: str = "meshkern-arrays") -> None:
    """Write `tensors` (GGUF llama names) as a dense-llama GGUF v3 file of F32 tensors."""
    n_kv_heads = n_kv_heads or n_heads
    t = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    hidden = t["token_embd.weight"].shape[1]
    n_layers = 1 + max(int(k.split(".")[1]) for k in t if k.startswith("blk."))
    intermediate = t["blk.0.ffn_gate.weight"].shape[0]
    if rope_layout == "rotate_half":
        for i in range(n_layers):
            t[f"blk.{i}.attn_q.weight"] = rotate_half_to_adjacent(t[f"blk.{i}.attn_q.weight"], n_heads)
            t[f"blk.{i}.attn_k.weight"] = rotate_half_to_adjacent(t[f"blk.{i}.attn_k.weight"], n_kv_heads)
    elif rope_layout != "adjacent_pairs":
        raise ValueError(f"unknown rope layout {rope_layout!r}")
    kvs = [_kv("general.architecture", _T_STRING, "llama"), _kv("general.name", _T_STRING, name),
           _kv("general.alignment", _T_UINT32, _ALIGN),
           _kv("llama.context_length", _T_UINT32, max_context), _kv("llama.embedding_length", _T_UINT32, hidden),
           _kv("llama.block_count", _T_UINT32, n_layers), _kv("llama.feed_forward_length", _T_UINT32, intermediate),
           _kv("llama.attention.head_count", _T_UINT32, n_heads),
           _kv("llama.attention.head_count_kv", _T_UINT32, n_kv_heads),
           _kv("llama.rope.freq_base", _T_FLOAT32, rope_theta),
           _kv("llama.attention.layer_norm_rms_epsilon", _T_FLOAT32, rms_eps)]
    infos, offset, blobs = [], 0, []
    for key, a in t.items():
        dims = list(reversed(a.shape))  # GGUF lists dims fastest first
        infos.append(_s(key) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) +
                     struct.pack("<IQ", 0, offset))  # type 0 = F32
        pad = (-a.nbytes) % _ALIGN
        blobs.append(a.tobytes() + b"\0" * pad)
        offset += a.nbytes + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(t), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * ((-len(head)) % _ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
