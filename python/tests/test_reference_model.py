"""The reference suite's numpy model loaded into meshkern (Model.from_arrays) and run as
meshkern.Shard: whole vs split bit-exact, and within the reference's tolerance of numpy."""

from __future__ import annotations

import numpy as np
import pytest

import meshkern as mk
from meshkern.boundary import BoundaryAdapter, BoundaryBundle, TailOutput

import test_boundary_adapter_parity as ref


def reference_arrays(m: ref._ReferenceDenseLlama) -> dict:
    t = {"token_embd.weight": m.embed, "output_norm.weight": m.final_ln, "output.weight": m.lm_head_w}
    for i, L in enumerate(m.layers):
        for ours, theirs in [("attn_norm", "in_ln"), ("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"),
                             ("attn_output", "o"), ("ffn_norm", "post_ln"), ("ffn_gate", "gate"), ("ffn_up", "up"),
                             ("ffn_down", "down")]:
            t[f"blk.{i}.{ours}.weight"] = L[theirs]
    return t


@pytest.fixture(scope="module")
def pair():
    numpy_model = ref._ReferenceDenseLlama()
    model = mk.Model.from_arrays(reference_arrays(numpy_model), n_heads=numpy_model.n_heads,
                                 rms_eps=numpy_model.rms_eps, rope_theta=numpy_model.rope_theta,
                                 rope_layout="rotate_half")
    return numpy_model, model


def _split(model, prompt, cuts):
    bounds, start = [], 0
    for c in cuts:
        bounds.append((start, c))
        start = c + 1
    bounds.append((start, model.n_layers - 1))
    out = None
    for i, (s, e) in enumerate(bounds):
        adapter = BoundaryAdapter(mk.Shard(model, s, e))
        out = adapter.forward(token_ids=prompt) if i == 0 else \
            adapter.forward(boundary=BoundaryBundle.unpack(out.pack()))
    assert isinstance(out, TailOutput)
    return out


def test_hparams_match(pair):
    numpy_model, model = pair
    hp = model.hparams
    assert (hp["vocab"], hp["hidden"], hp["n_layers"], hp["n_heads"], hp["intermediate"]) == (
        numpy_model.vocab, numpy_model.hidden, numpy_model.n_layers, numpy_model.n_heads, 64)


@pytest.mark.parametrize("prompt,cuts", [([5, 12, 3, 41, 7, 19, 2, 33], [2]), ([9, 1, 44, 6, 30, 11], [1, 3]),
                                         ([7, 3, 22, 5], [0, 2, 4])])
def test_shard_whole_vs_split_bit_exact_and_close_to_numpy(pair, prompt, cuts):
    numpy_model, model = pair
    whole = _split(model, prompt, [])
    split = _split(model, prompt, cuts)
    assert np.array_equal(whole.logits, split.logits) and whole.token_id == split.token_id
    numpy_out = BoundaryAdapter(ref._ReferenceShard(numpy_model, 0, 5)).forward(token_ids=prompt)
    diff = float(np.max(np.abs(whole.logits - numpy_out.logits)))
    print(f"\nmeshkern vs numpy: max |logit diff| {diff:.2e}")
    assert np.allclose(whole.logits, numpy_out.logits, atol=ref.PARITY_ATOL)
    assert whole.token_id == numpy_out.token_id


def test_shard_greedy_decode_matches_numpy(pair):
    numpy_model, model = pair
    prompt, n_new = [2, 17, 8, 25], 12
    ours = ref._greedy_generate(lambda toks: _split(model, toks, [2]), prompt, n_new)
    theirs = ref._greedy_generate(lambda toks: ref._whole_model_next_token(numpy_model, toks), prompt, n_new)
    assert ours == theirs


def test_head_residual_close_to_numpy(pair):
    numpy_model, model = pair
    tokens = [3, 7, 1, 9, 2]
    bundle = BoundaryAdapter(mk.Shard(model, 0, 2)).forward(token_ids=tokens)
    hidden = numpy_model.embed[np.asarray(tokens)][None, :]
    for idx in range(3):
        hidden = numpy_model._run_layer(hidden, numpy_model.layers[idx], np.arange(len(tokens))[None, :])
    assert bundle.residual.shape == hidden.shape
    assert np.allclose(bundle.residual, hidden, atol=ref.PARITY_ATOL)
