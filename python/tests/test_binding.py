"""The binding: contract cases through Python, parity, zero-copy views, leaks, the GIL."""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
import tracemalloc

import numpy as np
import pytest

import meshkern as mk
from meshkern import errors
from meshkern.boundary import (BoundaryAdapter, BoundaryBundle, BoundaryContractError, SamplingContract, ShardRole,
                               UncertifiedArchitectureError, certified_architecture, role_for_range)


@pytest.fixture(scope="module")
def model():
    return mk.Model.random(seed=7)


def _split(model, cuts):
    bounds, start = [], 0
    for c in cuts:
        bounds.append((start, c))
        start = c + 1
    bounds.append((start, model.n_layers - 1))
    return [mk.Range(model, s, e, threads=1) for s, e in bounds]


# ------------------------------------------------------------------ errors ----

def test_exception_classes_follow_the_status_families():
    assert issubclass(errors.UncertifiedArchitectureError, errors.ArchitectureError)
    assert issubclass(errors.SeamMismatchError, BoundaryContractError)
    assert issubclass(errors.WireDecodeError, errors.WireError)
    assert issubclass(errors.WireError, BoundaryContractError)
    assert issubclass(errors.GgufMagicError, errors.ModelFileError)
    assert issubclass(errors.PeerClosedError, errors.SeamError)
    assert issubclass(errors.InvalidUtf8Error, errors.TextError)
    for code, cls in errors.STATUS_CLASSES.items():
        assert issubclass(cls, mk.MeshkernError)
        assert cls.code == code
        assert mk.ffi.string(mk.lib.mk_status_name(code)).decode() == cls.status


def test_every_status_class_is_in_its_family():
    """The module docstring's table: each code range's classes derive from its family (40..59
    are wire errors, and so contract errors, up to MK_ERR_TAIL_RESULT = 55)."""
    families = [(1, 10, errors.GeneralError), (10, 20, errors.ArchitectureError),
                (20, 40, BoundaryContractError), (40, 60, errors.WireError), (60, 80, errors.ModelFileError),
                (80, 90, errors.DeviceError), (90, 100, errors.SeamError), (100, 110, errors.TextError)]
    for code, cls in errors.STATUS_CLASSES.items():
        family = [f for lo, hi, f in families if lo <= code < hi]
        assert family and issubclass(cls, family[0]), (code, cls.__mro__)
    for cls in (errors.DataLengthError, errors.RecipeDigestError, errors.BoundaryPointError, errors.TailResultError):
        assert issubclass(cls, errors.WireError) and issubclass(cls, BoundaryContractError)
    with pytest.raises(BoundaryContractError):
        mk.tail_result_pack_token(1, identity=dict(request_id="", runtime_recipe_digest="0" * 64))


def test_error_carries_status_name_code_and_message():
    with pytest.raises(UncertifiedArchitectureError) as ei:
        certified_architecture("qwen3")
    e = ei.value
    assert e.status == "MK_ERR_UNCERTIFIED_ARCHITECTURE" and e.code == 10
    assert "qwen3" in e.message and e.message in str(e)


def test_roles_through_c():
    assert role_for_range(0, 2, 6) is ShardRole.HEAD
    assert role_for_range(0, 5, 6) is ShardRole.FULL
    assert ShardRole.FULL.owns_embedding and ShardRole.FULL.owns_final_head
    assert not ShardRole.MIDDLE.owns_embedding and not ShardRole.MIDDLE.owns_final_head
    with pytest.raises(errors.InvalidRangeError):
        role_for_range(3, 2, 6)
    with pytest.raises(errors.InvalidRangeError):
        role_for_range(4, 6, 6)


def test_sampling_contract():
    assert SamplingContract().mode == "greedy"
    for mode in ("top_p", "top_k", "temperature"):
        with pytest.raises(errors.UncertifiedSamplingError):
            SamplingContract(mode)


# --------------------------------------------------------- input contract ----

def test_range_input_contract(model):
    head, tail = _split(model, [2])
    hs, ts = head.sequence(), tail.sequence()
    b = hs.forward([1, 2, 3])
    assert isinstance(b, mk.Bundle) and b.header.next_layer == 3
    with pytest.raises(errors.HeadOwnsEmbeddingError, match="head owns token embedding"):
        hs.forward(bundle=b)
    with pytest.raises(errors.BypassEmbeddingError, match="bypass token embedding"):
        ts.forward([1, 2])
    with pytest.raises(errors.BundleRequiredError, match="must receive the named boundary bundle"):
        ts.forward()
    with pytest.raises(errors.EmptyInputError):
        hs.forward([])
    with pytest.raises(errors.TokenOutOfRangeError):
        hs.forward([model.hparams["vocab"]])
    with pytest.raises(errors.UncertifiedSamplingError):
        ts.forward(bundle=b, sampling="top_p")
    out = ts.forward(bundle=b)
    assert isinstance(out, mk.TailOutput) and out.logits.shape == (1, model.hparams["vocab"])


def test_seam_normalized_and_digest_checks(model):
    head = mk.Range(model, 0, 2)
    b = head.sequence().forward([1, 2, 3])
    wrong = mk.Range(model, 4, 5)
    with pytest.raises(errors.SeamMismatchError, match="starts at layer 4"):
        wrong.sequence().forward(bundle=b)
    tail = mk.Range(model, 3, 5)
    n = b.clone()
    n.set_header(normalized=True)
    with pytest.raises(errors.NormalizedBundleError, match="UNNORMALIZED"):
        tail.sequence().forward(bundle=n)
    # the same check on the header alone, as a transport applies it
    with pytest.raises(errors.NormalizedBundleError):
        tail.check_boundary(tail.sequence(), n.header)
    tail.check_boundary(tail.sequence(), b.header)
    # another model's bundle: the recipe digest differs
    other = mk.Model.random(seed=8)
    ob = mk.Range(other, 0, 2).sequence().forward([1, 2, 3])
    with pytest.raises(errors.RecipeDigestError):
        tail.sequence().forward(bundle=ob)
    # a wider model's bundle
    wide = mk.Model.random(seed=7, hidden=64, head_dim=16)
    wb = mk.Range(wide, 0, 2).sequence().forward([1, 2, 3])
    with pytest.raises((errors.HiddenWidthError, errors.RecipeDigestError)):
        tail.sequence().forward(bundle=wb)


def test_digests(model):
    assert len(model.digest) == 64 and int(model.digest, 16) >= 0
    assert mk.Model.random(seed=7).digest == model.digest
    assert mk.Model.random(seed=8).digest != model.digest
    head = mk.Range(model, 0, 2)
    b = head.sequence().forward([4, 5])
    assert b.header.recipe_digest == head.recipe_digest == mk.Range(model, 3, 5).recipe_digest


def test_hparams_rope_layout_round_trips(model):
    assert mk.seed_hparams()["rope_layout"] == "rotate_half" == model.hparams["rope_layout"]
    adj = mk.Model.random(seed=7, rope_layout="adjacent_pairs")
    assert adj.hparams["rope_layout"] == "adjacent_pairs"
    assert mk.Model.random(seed=7, rope_layout="rotate_half").hparams["rope_layout"] == "rotate_half"
    # the layout reaches the C model: the same weights, other logits
    a = mk.Range(model, 0, 5, threads=1).sequence().forward([5, 12, 3])
    b = mk.Range(adj, 0, 5, threads=1).sequence().forward([5, 12, 3])
    assert not np.array_equal(a.logits, b.logits)


def test_token_only_range_returns_no_logits(model):
    full = mk.Range(model, 0, 5, threads=1).sequence().forward([5, 12, 3])
    out = mk.Range(model, 0, 5, threads=1, token_only=True).sequence().forward([5, 12, 3])
    assert out.logits is None and full.logits is not None
    assert out.token_id == full.token_id


def test_shard_passes_its_range_options_on(model):
    """Shard(..., **range_options): the options reach the range it builds (a context of 8
    positions refuses a forward of 9; the default context takes it)."""
    small = mk.Shard(model, 0, 5, threads=1, max_context=8)
    with pytest.raises(errors.MeshkernError, match="max_context 8"):
        small.forward(list(range(1, 10)))
    assert mk.Shard(model, 0, 5, threads=1).forward(list(range(1, 10))).logits is not None


def test_shard_stateless_by_default_and_stateful_on_request(model):
    """Shard(stateless=True) starts every forward from an empty KV cache; stateless=False
    keeps the sequence, so a forward continues it."""
    fresh = mk.Range(model, 0, 5, threads=1).sequence()
    first = fresh.forward([5, 12, 3]).logits.copy()
    cont = fresh.forward([7]).logits.copy()
    s = mk.Shard(model, 0, 5, threads=1)
    assert np.array_equal(s.forward([5, 12, 3]).logits, first)
    assert np.array_equal(s.forward([5, 12, 3]).logits, first) and len(s.sequence) == 3
    k = mk.Shard(model, 0, 5, stateless=False, threads=1)
    assert np.array_equal(k.forward([5, 12, 3]).logits, first)
    assert np.array_equal(k.forward([7]).logits, cont) and len(k.sequence) == 4
    k.reset()
    assert len(k.sequence) == 0


def test_duck_head_refuses_empty_token_ids():
    """A duck-typed head: no token ids is MK_ERR_EMPTY_INPUT before the shard is called."""
    from test_boundary_adapter_parity import _ReferenceDenseLlama, _ReferenceShard

    head = BoundaryAdapter(_ReferenceShard(_ReferenceDenseLlama(), 0, 2))
    for ids in ([], np.zeros((1, 0), dtype=np.int64)):
        with pytest.raises(errors.EmptyInputError, match="at least one token id"):
            head.forward(token_ids=ids)


def test_duck_tail_refuses_a_bundle_without_the_recipe_digest():
    """A duck-typed tail checks the recipe digest like mk_range_check_boundary: a bundle
    that carries none (or another one) is refused, the head's own is accepted."""
    from test_boundary_adapter_parity import _ReferenceDenseLlama, _ReferenceShard

    ref = _ReferenceDenseLlama()
    head = BoundaryAdapter(_ReferenceShard(ref, 0, 2))
    tail = BoundaryAdapter(_ReferenceShard(ref, 3, 5))
    b = head.forward(token_ids=[1, 2, 3])
    assert b.recipe_digest == head.recipe_digest == tail.recipe_digest != ""
    for digest in ("", "0" * 64):
        foreign = BoundaryBundle(residual=b.residual, positions=b.positions, next_layer=3, recipe_digest=digest)
        with pytest.raises(errors.RecipeDigestError, match="recipe digest"):
            tail.forward(boundary=foreign)
    assert tail.forward(boundary=b).logits.shape == (1, ref.vocab)


# ------------------------------------------------------------------- wire ----

def test_malformed_bytes_raise_the_right_class(model):
    b = mk.Range(model, 0, 2).sequence().forward([1, 2, 3, 4])
    data = b.to_bytes()
    assert mk.Bundle.from_bytes(data).header == b.header
    with pytest.raises(errors.WireDecodeError):
        mk.Bundle.from_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(errors.WireError):          # truncated: decode error or missing field
        mk.Bundle.from_bytes(data[: len(data) // 2])
    with pytest.raises(BoundaryContractError):     # and every wire error is a contract error
        mk.Bundle.from_bytes(data[:7])
    for field, value, cls in [("schema_version", 2, errors.SchemaVersionError),
                              ("tensor_name", "hidden_states", errors.TensorNameError),
                              ("adapter", "qwen3", UncertifiedArchitectureError),
                              ("boundary_point", "pre_tail_residual", errors.BoundaryPointError)]:
        c = b.clone()
        c.set_header(**{field: value})
        with pytest.raises(cls):
            mk.Bundle.from_bytes(c.to_bytes())
    with pytest.raises(errors.ShapeError):
        b.set_header(rows=9)


def test_tail_results(model):
    ident = dict(request_id="req-1", runtime_recipe_digest=model.digest)
    info = mk.tail_result_validate(mk.tail_result_pack_token(17, identity=ident))
    assert info["kind"] == "token" and info["token_id"] == 17 and info["greedy"] and info["request_id"] == "req-1"
    logits = np.arange(48, dtype=np.float32)
    info = mk.tail_result_validate(mk.tail_result_pack_logits(logits, identity=ident))
    assert info["kind"] == "logits" and (info["batch"], info["vocab"]) == (1, 48)
    with pytest.raises(errors.TailResultError, match="request and recipe identity"):
        mk.tail_result_pack_token(1, identity=dict(request_id="", runtime_recipe_digest=model.digest))
    with pytest.raises(errors.WireError):
        mk.tail_result_validate(b"\x00\x01\x02")
    # mk_protocol_bundle_* (moe/mla bundles) are internal test helpers since 0.2.0: their
    # checks are in tests/test_bundle_malformed.cpp (ProtocolBundles).


# ----------------------------------------------------------------- parity ----

def _run_split(model, prompt, n_new, cuts, *, wire=True):
    ranges = _split(model, cuts)
    seqs = [r.sequence() for r in ranges]
    logits, tokens, ids = [], [], list(prompt)
    for _ in range(n_new):
        x = seqs[0].forward(ids)
        for s in seqs[1:]:
            x = s.forward(bundle=mk.Bundle.from_bytes(x.to_bytes()) if wire else x)
        logits.append(x.logits.copy())
        tokens.append(x.token_id)
        ids = [x.token_id]
    return np.stack(logits), tokens


@pytest.mark.parametrize("cuts", [[2], [0, 3], [1, 2, 4]])
def test_whole_vs_split_bit_exact_with_kv_cache(model, cuts):
    whole_logits, whole_tokens = _run_split(model, [5, 12, 3, 41, 7, 19], 8, [])
    split_logits, split_tokens = _run_split(model, [5, 12, 3, 41, 7, 19], 8, cuts)
    assert np.array_equal(whole_logits, split_logits)
    assert whole_tokens == split_tokens


def test_pipeline_whole_vs_wire_split_bit_exact(model):
    whole = mk.Pipeline(model, [], threads=1)
    split = mk.Pipeline(model, [1, 3], seam="wire", threads=1)
    assert split.range_bounds() == [(0, 1), (2, 3), (4, 5)]
    a, b = whole.step([3, 1, 4, 1, 5]), split.step([3, 1, 4, 1, 5])
    assert np.array_equal(a.logits, b.logits) and a.token_id == b.token_id
    assert split.seam_bytes > 0
    st = mk.GenerateStats()
    assert list(whole.generate([a.token_id], 6)) == list(split.generate([b.token_id], 6, stats=st))
    # the C call's figures, every one of them: 6 tokens, the first from the prefill
    assert st.n_prompt == 1 and st.n_generated == 6 and not st.stopped_at_eog and st.eog_token == -1
    assert st.prefill_s > 0 and st.decode_s > 0


def test_generate_raises_the_c_error_and_stops_when_closed_early(model):
    pipe = mk.Pipeline(model, [2], threads=1)
    vocab = model.hparams["vocab"]
    # A failure inside mk_pipeline_generate reaches the caller as its status class, as step's does.
    with pytest.raises(errors.TokenOutOfRangeError):
        pipe.step([vocab])
    pipe.reset()
    with pytest.raises(errors.TokenOutOfRangeError):
        list(pipe.generate([3, vocab], 4))
    # A consumer that closes the iterator early gets no error, and the pipeline stays usable.
    pipe.reset()
    it = pipe.generate([3, 1, 4], 8)
    first = next(it)
    it.close()
    pipe.reset()
    assert list(pipe.generate([3, 1, 4], 8))[0] == first


def test_shard_in_the_boundary_adapter(model):
    prompt = [9, 1, 44, 6, 30, 11]
    whole = BoundaryAdapter(mk.Shard(model, 0, 5)).forward(token_ids=prompt)
    head = BoundaryAdapter(mk.Shard(model, 0, 1, architecture_adapter="LlamaForCausalLM"))
    mid = BoundaryAdapter(mk.Shard(model, 2, 3))
    tail = BoundaryAdapter(mk.Shard(model, 4, 5, architecture_adapter="llama"))
    assert (head.role, mid.role, tail.role) == (ShardRole.HEAD, ShardRole.MIDDLE, ShardRole.TAIL)
    b = head.forward(token_ids=prompt)
    assert isinstance(b, BoundaryBundle) and b.next_layer == 2 and not b.normalized
    assert b.residual.shape == (1, len(prompt), model.hparams["hidden"])
    b = mid.forward(boundary=BoundaryBundle.unpack(b.pack()))
    out = tail.forward(boundary=BoundaryBundle.unpack(b.pack()))
    assert np.array_equal(out.logits, whole.logits) and out.token_id == whole.token_id
    assert out.sampling.mode == "greedy" and out.token_id == int(np.argmax(out.logits[0]))
    with pytest.raises(errors.SeamMismatchError, match="starts at layer 4"):
        tail.forward(boundary=head.forward(token_ids=prompt))
    with pytest.raises(errors.HeadOwnsEmbeddingError):
        head.forward(boundary=b)
    tr = out.tail_result(request_id="r", runtime_recipe_digest=tail.recipe_digest)
    assert mk.tail_result_validate(tr)["token_id"] == out.token_id


# ------------------------------------------------------------- zero copy ----

def test_bundle_views_alias_the_c_arrays(model):
    b = mk.Range(model, 0, 2).sequence().forward([1, 2, 3])
    r1, r2 = b.residual, b.residual
    r1[0, 1, 5] = 1234.5
    assert r2[0, 1, 5] == 1234.5                                 # write through one, read through the other
    assert mk.Bundle.from_bytes(b.to_bytes()).residual[0, 1, 5] == 1234.5   # the C bundle sees it
    p = b.positions
    assert p.tolist() == [[0, 1, 2]] and p.dtype == np.int32
    del b
    gc.collect()
    assert r1[0, 1, 5] == 1234.5                                 # a view keeps the bundle alive


def test_tail_output_views(model):
    out = mk.Range(model, 0, 5).sequence().forward([1, 2, 3])
    assert out.logits.base is not None and out.logits.flags.c_contiguous
    assert out.token_id == int(np.argmax(out.logits[0]))


# ------------------------------------------------------------------ leaks ----

def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def test_no_leak_over_10000_create_free_cycles(model):
    rng = mk.Range(model, 0, 2, max_context=64)
    seq = rng.sequence()
    data = seq.forward([1, 2, 3]).to_bytes()

    def cycle(i):
        b = mk.Bundle.from_bytes(data)          # unpack (alloc) ... views, header, pack, free
        _ = b.residual.sum() + b.positions[0, -1]
        b.to_bytes()
        s = rng.sequence()                       # a sequence (KV cache) opened and closed
        del s, b
        if i % 10 == 0:
            m = mk.Model.random(seed=i)           # a model and a range over it
            r = mk.Range(m, 0, 0, max_context=16)
            del r, m

    for i in range(500):                         # warm up allocator pools
        cycle(i)
    gc.collect()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    rss0 = _rss_kb()
    for i in range(10_000):
        cycle(i)
    gc.collect()
    rss1 = _rss_kb()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    py_growth = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    print(f"\nleak: 10000 cycles: python heap {py_growth / 1024:+.1f} KiB, process RSS {rss1 - rss0:+d} KiB")
    assert py_growth < 64 * 1024
    assert rss1 - rss0 < 4 * 1024


# -------------------------------------------------------------------- GIL ----

@pytest.fixture(scope="module")
def gil_model():
    # wide enough that a forward pass is milliseconds of C
    return mk.Model.random(seed=3, vocab=2048, hidden=512, n_heads=8, n_kv_heads=8, head_dim=64, intermediate=1536, max_context=512,
                           n_layers=4)


def test_gil_released_during_forward(gil_model):
    """While one thread is inside a forward pass, another Python thread keeps running:
    it makes progress strictly inside the C call (with the GIL held it could only run
    between calls)."""
    r = mk.Range(gil_model, 0, 3, threads=1, max_context=512)
    s = r.sequence()
    s.forward([1])                               # warm: weights materialised, pools started
    s.reset()
    stamps, done = [], threading.Event()

    def spin():
        i = 0
        while not done.is_set():
            i += 1
            if i % 200 == 0:
                stamps.append(time.perf_counter())

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.02)
    t0 = time.perf_counter()
    s.forward(list(range(256)))                  # one C call
    t1 = time.perf_counter()
    done.set()
    t.join()
    lo, hi = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
    inside = sum(lo < x < hi for x in stamps)
    print(f"\nGIL: {inside} progress stamps of the other thread inside one {t1 - t0:.2f}s forward pass")
    assert inside > 10


def test_library_location():
    """Installed: the library bundled in the wheel; MESHKERN_LIB overrides it."""
    import pathlib

    env = os.environ.get("MESHKERN_LIB")
    if env:
        assert mk.LIBRARY_PATH == env
    else:
        assert pathlib.Path(mk.LIBRARY_PATH).parent.name == "_lib" or "libmeshkern" in mk.LIBRARY_PATH
    assert "mk_range_forward" in mk._lib.CDEF    # the cdef comes from the shipped public header


def test_scheduler_matches_the_pipeline(model):
    prompts = [[5, 12, 3], [9, 1, 44, 6], [2, 17]]
    expect = []
    for p in prompts:
        pipe = mk.Pipeline(model, [2], threads=1)
        expect.append(list(pipe.generate(p, 5)))
    seen: dict = {}

    def on_token(seq_id, index, token, logits):
        assert index == len(seen.setdefault(seq_id, [])) and int(np.argmax(logits)) == token
        seen[seq_id].append(token)

    s = mk.Scheduler(model, [2], max_sequences=2, seam="wire", threads=1, on_token=on_token)
    assert s.n_workers == 2 and s.worker_bounds() == [(0, 2), (3, 5)] and s.seam_kind(0) == "wire"
    ids = [s.submit(p, 5) for p in prompts]
    s.wait_all()
    for sid, want in zip(ids, expect):
        info = s.poll(sid)
        assert info.state == "done" and info.status == "MK_OK" and info.tokens == want == seen[sid]
    with pytest.raises(errors.InvalidArgumentError):
        s.submit([], 5)


def test_scheduler_stops_at_a_stop_id(model):
    s = mk.Scheduler(model, [2], threads=1)
    free = s.wait(s.submit([5, 12, 3], 6)).tokens
    assert len(free) == 6
    stop = free[3]
    info = s.wait(s.submit([5, 12, 3], 6, stop_ids=[stop]))
    assert info.state == "done" and info.stopped
    assert info.tokens == free[: free.index(stop) + 1]
    info = s.wait(s.submit([5, 12, 3], 6, stop_ids=[-1]))   # an id that never comes
    assert info.tokens == free and not info.stopped


def test_scheduler_cancel_and_release(model):
    want = mk.Scheduler(model, [2], threads=1)
    full = want.wait(want.submit([5, 12, 3], 12)).tokens
    held, go = threading.Event(), threading.Event()

    def on_token(seq_id, index, token, logits):
        if seq_id == 1 and index == 2:  # hold the running sequence at its third token
            held.set()
            go.wait(30)

    s = mk.Scheduler(model, [2], threads=1, max_sequences=1, on_token=on_token)
    a = s.submit([5, 12, 3], 12)
    assert held.wait(30)
    b = s.submit([5, 12, 3], 12)  # no free slot: queued
    s.cancel(b)  # a queued sequence leaves the queue at once
    info = s.wait(b)
    assert (info.state, info.n_tokens, info.stopped) == ("done", 0, False)
    s.cancel(a)  # a running one retires after the step in flight
    go.set()
    info = s.wait(a)
    assert info.state == "done" and not info.stopped and info.status == "MK_OK"
    assert 3 <= info.n_tokens < len(full) and info.tokens == full[: info.n_tokens]
    s.cancel(a)  # finished: left as it is
    assert s.poll(a).tokens == info.tokens
    s.release(a)
    with pytest.raises(errors.InvalidArgumentError, match=f"no sequence {a}"):
        s.poll(a)
    with pytest.raises(errors.InvalidArgumentError):
        s.cancel(a)
    assert s.wait(s.submit([5, 12, 3], 12)).tokens == full  # the slot is free again


def _seam_run(head, tail, tx, rx, prompt, n):
    hs, ts = head.sequence(), tail.sequence()
    bo, bi = head.boundary(), tail.boundary()
    ids, toks = list(prompt), []
    for _ in range(n):
        assert head.forward_boundary(hs, ids, out=bo) is None
        tx.send(bo)
        rx.recv(ts, bi)
        tx.send_wait()
        out = tail.forward_boundary(ts, into=bi)
        toks.append(out.token_id)
        ids = [out.token_id]
    return toks


@pytest.mark.parametrize("kind,tls", [("unix", None), ("tcp", None),
                                      ("tcp", {"psk_hex": "00112233445566778899aabbccddeeff" * 2})])
def test_seams_carry_the_boundary(model, kind, tls):
    want = list(mk.Pipeline(model, [], threads=1).generate([3, 1, 4], 6))
    head, tail = mk.Range(model, 0, 2, threads=1), mk.Range(model, 3, 5, threads=1)
    if kind == "unix":
        tx, rx = mk.Seam.pair(head, tail, "unix")
    else:
        lst = mk.SeamListener("tcp", "127.0.0.1:0", **(tls or {}))
        got = {}
        t = threading.Thread(target=lambda: got.update(rx=lst.accept(tail)))   # accept waits without the GIL
        t.start()
        tx = mk.Seam.connect(head, "tcp", lst.address, **(tls or {}))
        t.join()
        rx = got["rx"]
    assert _seam_run(head, tail, tx, rx, [3, 1, 4], 6) == want
    assert rx.bytes > 0


@pytest.mark.parametrize("kind", ["wire", "unix"])
def test_a_batch_crosses_as_one_message_and_a_lying_entry_fails_alone(model, kind):
    head, tail = mk.Range(model, 0, 2, threads=1), mk.Range(model, 3, 5, threads=1)
    tx, rx = mk.Seam.pair(head, tail, kind)
    prompts = {"a": [3, 1, 4], "b": [1], "c": [5, 9, 2, 6, 5]}
    hs = {k: head.sequence() for k in prompts}
    ts = {k: tail.sequence() for k in prompts}
    outs = {k: head.boundary() for k in prompts}
    ins = [tail.boundary() for _ in prompts]
    for k, ids in prompts.items():
        head.forward_boundary(hs[k], ids, out=outs[k])
        outs[k].set_request(k)
    tx.send_batch(list(outs.values()))
    assert rx.recv_batch(ts, ins) == ["MK_OK"] * 3
    for b, k in zip(ins, prompts):
        assert b.header.request_id == k
        assert np.array_equal(b.read(), outs[k].read())   # bit for bit
    # the same rows again: "a" and "c" still continue their tail sequences (never run), but
    # "b" now names a request the receiver does not hold: it alone is refused
    outs["b"].set_request("nobody")
    tx.send_batch(list(outs.values()))
    assert rx.recv_batch(ts, ins) == ["MK_OK", "MK_ERR_INVALID_ARGUMENT", "MK_OK"]
    assert ins[1].header.rows == 0 and ins[2].header.rows == 5
    with pytest.raises(errors.InvalidArgumentError):
        outs["b"].set_request("x" * 64)


def test_seam_refuses_a_wrong_receiver(model):
    head, wrong = mk.Range(model, 0, 2), mk.Range(model, 4, 5)
    tx, rx = mk.Seam.pair(head, wrong, "unix")
    bo, bi = head.boundary(), wrong.boundary()
    head.forward_boundary(head.sequence(), [1, 2], out=bo)
    tx.send(bo)
    with pytest.raises(errors.SeamMismatchError):
        rx.recv(wrong.sequence(), bi)
    assert bo.read().shape == (2, model.hparams["hidden"])


def test_stages_in_two_threads(model):
    """The process-per-range runtime, its two ranks as two threads of this process."""
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    addr = f"127.0.0.1:{port}"
    prompts = [[5, 12, 3], [9, 1, 44, 6]]
    want = [list(mk.Pipeline(model, [2], threads=1).generate(p, 4)) for p in prompts]
    got, errs = {}, []

    def rank(r):
        try:
            st = mk.Stage(model, r, 2, addr, [2], timeout_ms=20000, max_new_tokens=4, threads=1)
            got[r] = (st.range_bounds, st.serve(prompts if r == 0 else []))
        except Exception as e:  # surfaced below
            errs.append(e)

    ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    assert got[0][0] == (0, 2) and got[1][0] == (3, 5)
    reports = sorted(got[0][1], key=lambda r: r["request"])
    assert [r["status"] for r in reports] == ["MK_OK", "MK_OK"]
    assert [r["tokens"] for r in reports] == want


# ------------------------------------------------------------------- KV pool ----

def test_paged_kv_pool_through_python(model):
    r = mk.Range(model, 0, model.n_layers - 1, kv_block_size=4, kv_pool_blocks=3)
    assert r.kv_pool == {"block_size": 4, "block_bytes": r.kv_pool["block_bytes"], "blocks": 3, "free_blocks": 3,
                         "promised_blocks": 0}
    a, b = r.sequence(), r.sequence()
    a.reserve(8)  # two blocks set aside for a
    assert r.kv_pool["promised_blocks"] == 2
    with pytest.raises(errors.KvPoolFullError, match="KV pool full"):
        b.forward([1, 2, 3, 4, 5])  # two blocks: only one is not promised
    assert len(b) == 0
    b.forward([1, 2, 3, 4])
    out = a.forward([5, 6, 7, 8, 9, 10, 11, 12])  # its promise
    assert out.logits.shape[1] == model.hparams["vocab"]
    assert r.kv_pool["free_blocks"] == 0 and r.kv_pool["promised_blocks"] == 0
    a.reset()
    b.reset()
    assert r.kv_pool["free_blocks"] == 3
    with pytest.raises(errors.InvalidArgumentError, match="kv_block_size"):
        mk.Range(model, 0, 1, kv_block_size=6)



# ------------------------------------------------------------- review fixes ----

def test_token_ids_that_do_not_fit_int32_are_refused_not_wrapped(model):
    """2**32 + 5 would wrap to token 5 in an int32 array: refused as out of range."""
    r = mk.Range(model, 0, 5, threads=1)
    for bad in ([2 ** 32 + 5], [3, -(2 ** 32) + 5], np.array([2 ** 33 + 1], dtype=np.int64)):
        with pytest.raises(errors.TokenOutOfRangeError, match="does not fit an int32"):
            r.sequence().forward(bad)
    with pytest.raises(errors.TokenOutOfRangeError):
        mk.Pipeline(model, [2], threads=1).step([2 ** 32 + 5])
    s = mk.Scheduler(model, [2], threads=1)
    with pytest.raises(errors.TokenOutOfRangeError):
        s.submit([5, 12, 3], 4, stop_ids=[2 ** 32 + 5])
    assert r.sequence().forward(np.array([5, 7], dtype=np.int64)).logits.shape[0] == 1


def test_random_model_refuses_an_unknown_rope_layout():
    """A misspelt layout was taken as adjacent_pairs without a word."""
    for bad in ("rotate-half", "ROTATE_HALF", "adjacent"):
        with pytest.raises(ValueError, match="rope layout"):
            mk.Model.random(seed=7, rope_layout=bad)


def test_tail_result_logits_of_another_rank_are_refused(model):
    """[batch, rows, vocab] logits were packed as [batch, rows] of the first floats, and a
    token_only output's logits (None) as one NaN logit."""
    ident = dict(request_id="req-1", runtime_recipe_digest=model.digest)
    with pytest.raises(errors.ShapeError, match=r"\[batch, vocab\]"):
        mk.tail_result_pack_logits(np.zeros((1, 2, 48), np.float32), identity=ident)
    with pytest.raises(errors.ShapeError):
        mk.tail_result_pack_logits(None, identity=ident)
    out = BoundaryAdapter(mk.Shard(model, 0, 5, token_only=True)).forward(token_ids=[5, 12, 3])
    assert out.logits is None
    with pytest.raises(errors.ShapeError):
        out.tail_result(request_id="r", runtime_recipe_digest=model.digest, logits=True)
    assert mk.tail_result_validate(out.tail_result(request_id="r", runtime_recipe_digest=model.digest))["kind"] == "token"
    strided = np.zeros((2, 96), np.float32)[:, ::2]                # non-contiguous is fine
    assert mk.tail_result_validate(mk.tail_result_pack_logits(strided, identity=ident))["vocab"] == 48


def test_generate_raises_a_bad_argument_instead_of_hanging(model):
    """An exception on the generation worker (here the C call's argument conversion) used to
    kill the worker before it ended the queue: the iterator waited forever."""
    pipe = mk.Pipeline(model, [2], threads=1)
    got = []

    def consume(**kw):
        try:
            list(pipe.generate([3, 1, 4], **kw))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            got.append(e)

    for kw, cls in (({"max_new": -1}, OverflowError), ({"max_new": 4, "tokenizer": "not a tokenizer"}, AttributeError)):
        t = threading.Thread(target=consume, kwargs=kw, daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), "generate hung"
        assert isinstance(got.pop(), cls)
    pipe.reset()
    assert len(list(pipe.generate([3, 1, 4], 4))) == 4


def test_pipeline_reset_waits_for_a_running_generation():
    """The generation worker runs ahead of its consumer; reset() from the loop body ran the
    C reset concurrently with mk_pipeline_generate on the same sequence."""
    m = mk.Model.random(seed=3, vocab=2048, hidden=256, n_heads=4, n_kv_heads=4, head_dim=64, intermediate=512,
                        max_context=512, n_layers=2)
    pipe = mk.Pipeline(m, [0], threads=1)
    want = list(pipe.generate([3, 1, 4], 40))
    pipe.reset()
    for _ in pipe.generate([3, 1, 4], 40):
        pipe.reset()
        break
    assert list(pipe.generate([3, 1, 4], 40)) == want


def test_scheduler_wait_returns_every_token_past_the_poll_cap():
    """wait() polled with poll's default cap (4096): a longer run came back cut short."""
    m = mk.Model.random(seed=7, n_layers=1, max_context=8192)
    s = mk.Scheduler(m, [], threads=1, max_sequences=1, max_context=4200)
    sid = s.submit([1, 2], 4100)
    info = s.wait(sid)
    assert info.state == "done" and info.n_tokens == 4100 and len(info.tokens) == 4100
    assert s.poll(sid, cap=3).tokens == info.tokens[:3]        # poll keeps its cap


def test_seam_tls_options_never_fall_back_to_plaintext(model, tmp_path):
    """TLS was enabled only for psk_hex or cert_file: a key or CA alone, an identity alone or
    an empty key gave a plaintext seam instead of the C library's refusal."""
    pem = tmp_path / "x.pem"
    pem.write_text("not a pem")
    for opts in ({"ca_file": str(pem)}, {"key_file": str(pem), "ca_file": str(pem)}, {"psk_identity": "node-1"}):
        with pytest.raises(errors.InvalidArgumentError, match="seam TLS"):
            mk.SeamListener("tcp", "127.0.0.1:0", **opts)
        with pytest.raises(errors.InvalidArgumentError, match="seam TLS"):
            mk.Seam.pair(mk.Range(model, 0, 2), mk.Range(model, 3, 5), "unix", **opts)
    with pytest.raises(mk.MeshkernError):   # an empty key is a key, and a bad one
        mk.Seam.pair(mk.Range(model, 0, 2), mk.Range(model, 3, 5), "unix", psk_hex="")


def test_local_seam_keeps_a_sent_boundary_until_it_is_received(model):
    """The local seam hands the receiver the sender's boundary itself: a boundary dropped
    after send was freed before recv read it (use after free: a garbage header or payload)."""
    head, tail = mk.Range(model, 0, 2, threads=1), mk.Range(model, 3, 5, threads=1)
    for drop_sender in (False, True):
        tx, rx = mk.Seam.pair(head, tail, "local")
        bo = head.boundary()
        head.forward_boundary(head.sequence(), [3, 1, 4], out=bo)
        want = bo.read()
        tx.send(bo)
        del bo
        if drop_sender:
            del tx                                   # the sending end may go first too
        gc.collect()
        junk = [mk.Bundle.create(1, 3, model.hparams["hidden"]) for _ in range(50)]  # reuse freed memory
        bi = tail.boundary()
        rx.recv(tail.sequence(), bi)
        assert np.array_equal(bi.read(), want)
        del junk


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_scheduler_on_token_exception_is_raised_by_the_next_wait(model):
    """An exception raised by on_token was swallowed by cffi ("Exception ignored") and the
    sequences finished as done without a word: the first one is now raised by the next
    wait / wait_all, then cleared."""
    calls = []

    def on_token(seq_id, index, token, logits):
        calls.append(index)
        if index >= 1:                                        # three in a row: boom 2, 3, 4
            raise KeyError(f"boom {len(calls)}")

    s = mk.Scheduler(model, [2], threads=1, on_token=on_token)
    sid = s.submit([5, 12, 3], 4)
    with pytest.raises(KeyError, match="boom 2"):          # the first one, not a later one
        s.wait(sid)
    info = s.wait(sid)                                        # cleared: the next wait returns
    assert info.state == "done" and len(info.tokens) == 4
    s.submit([5, 12, 3], 4)
    with pytest.raises(KeyError, match="boom"):
        s.wait_all()
    s.wait_all()


def test_unknown_option_names_raise_a_helpful_error(model):
    """Unknown names raised a bare KeyError. Names the C library parses (seam kinds, as
    Seam does; backends) raise its InvalidArgumentError; dtypes, which it has no parser for,
    raise ValueError naming the option and the accepted names."""
    with pytest.raises(errors.InvalidArgumentError, match="carrier-pigeon"):
        mk.Pipeline(model, [], seam="carrier-pigeon")
    with pytest.raises(errors.InvalidArgumentError, match="carrier-pigeon"):
        mk.Scheduler(model, [2], seam="carrier-pigeon")
    with pytest.raises(errors.InvalidArgumentError, match="carrier-pigeon"):
        mk.Stage(model, 0, 2, "127.0.0.1:0", [2], seam="carrier-pigeon")
    with pytest.raises(ValueError, match=r"weight_dtype.*'f8'.*f32"):
        mk.Range(model, 0, 2, weight_dtype="f8")
    with pytest.raises(ValueError, match=r"kv_dtype.*'x'.*f16"):
        mk.Pipeline(model, [], kv_dtype="x")
    with pytest.raises(ValueError, match=r"architecture.*'dinosaur'.*dense"):
        mk.tail_result_pack_token(3, identity=dict(request_id="r", runtime_recipe_digest=model.digest,
                                                   architecture="dinosaur"))
    assert mk.Pipeline(model, [2], seam="wire", threads=1).n_ranges == 2        # known names still work


def test_bytes_from_a_buffer_of_wide_items(model):
    """len() of a buffer counts items, not bytes: a memoryview cast to uint32 or a numpy
    uint32 array was passed to C as a quarter of its bytes."""
    b = _split(model, [2])[0].sequence().forward([5, 12, 3])
    for k in range(4):                      # a request id that makes the size a multiple of 4
        b.set_header(request_id="r" * (k + 1))
        wire = b.to_bytes()
        if len(wire) % 4 == 0:
            break
    for buf in (memoryview(wire).cast("I"), np.frombuffer(wire, dtype=np.uint32)):
        assert len(buf) == len(wire) // 4
        got = mk.Bundle.from_bytes(buf)
        assert got.to_bytes() == wire
        got.unpack_into(buf)
        assert got.to_bytes() == wire
    with pytest.raises(ValueError, match="contiguous"):
        mk.Bundle.from_bytes(np.frombuffer(wire * 2, dtype=np.uint8)[::2])
    for k in range(4):
        ident = dict(request_id="r" * (k + 1), runtime_recipe_digest=model.digest)
        tr = mk.tail_result_pack_logits(np.zeros((1, 48), np.float32), identity=ident)
        if len(tr) % 4 == 0:
            break
    assert mk.tail_result_validate(np.frombuffer(tr, np.uint32))["vocab"] == 48


def test_calls_on_a_closed_object_say_it_is_closed(model):
    """After close() a call raised cffi's 'must be a cdata pointer, not NoneType'."""
    m = mk.Model.random(seed=7, n_layers=2)
    r = mk.Range(m, 0, 1, threads=1)
    seq = r.sequence()
    b = mk.Bundle.create(1, 1, m.hparams["hidden"])
    pipe = mk.Pipeline(m, [], threads=1)
    sched = mk.Scheduler(m, [], threads=1)
    for obj, call in ((m, lambda: m.digest), (r, lambda: r.start), (seq, lambda: len(seq)),
                      (b, lambda: b.to_bytes()), (pipe, lambda: pipe.step([1])), (sched, lambda: sched.submit([1]))):
        obj.close()
        obj.close()                                           # twice is fine
        with pytest.raises(ValueError, match=f"{type(obj).__name__} is closed"):
            call()
    b2 = mk.Bundle.create(1, 1, 64)
    b2.close()
    with pytest.raises(ValueError, match="Bundle is closed"):
        mk.Range(model, 0, 2, threads=1).forward(mk.Range(model, 0, 2, threads=1).sequence(), bundle=b2)


def test_token_ids_that_are_not_integers_are_refused_not_truncated(model):
    """[1.7] ran token 1 (int() truncation), a bool mask ran tokens 0/1: only integers
    (Python ints, numpy integer arrays and scalars) are token ids; every other dtype,
    integral floats and bools included, raises TypeError naming it."""
    from test_boundary_adapter_parity import _ReferenceDenseLlama, _ReferenceShard

    r = mk.Range(model, 0, 5, threads=1)
    bad_ids = ([1.7], [5, 12.5, 3], [1.0], np.array([1.7]), np.array([5.0, 12.0]), np.float32(3.0), 2.0, [True],
               np.array([1, 0], dtype=bool), "abc", [1, None], np.array([5, 1.5], dtype=object))
    for bad in bad_ids:
        seq = r.sequence()
        with pytest.raises(TypeError, match="token ids must be integers"):
            seq.forward(bad)
        assert len(seq) == 0
    with pytest.raises(TypeError, match=r"1\.7"):
        r.sequence().forward([1.7])
    with pytest.raises(TypeError, match="float64"):
        r.sequence().forward(np.array([1.7]))
    with pytest.raises(TypeError):
        mk.Pipeline(model, [2], threads=1).step([1.7])
    s = mk.Scheduler(model, [2], threads=1)
    with pytest.raises(TypeError):
        s.submit([5, 12.5, 3], 4)
    with pytest.raises(TypeError):
        s.submit([5, 12, 3], 4, stop_ids=[2.5])
    with pytest.raises(TypeError):
        mk.Stage(model, 0, 2, "127.0.0.1:0", [2], stop_ids=[2.5])
    with pytest.raises(TypeError):
        mk.tail_result_pack_token(1.7, identity=dict(request_id="r", runtime_recipe_digest=model.digest))
    with pytest.raises(TypeError):
        BoundaryAdapter(mk.Shard(model, 0, 5, threads=1)).forward(token_ids=[[5.5, 12]])
    with pytest.raises(TypeError):
        BoundaryAdapter(_ReferenceShard(_ReferenceDenseLlama(), 0, 2)).forward(token_ids=np.array([1, 0], bool))
    # every integer form still runs, and runs the same tokens
    want = r.sequence().forward([5, 12, 3]).logits.copy()
    for good in (np.array([5, 12, 3], np.int32), np.array([5, 12, 3], np.uint16), np.array([[5, 12, 3]], np.int64),
                 [np.int64(5), np.uint64(12), 3], np.array([5, 12, 3], dtype=object), (5, 12, 3)):
        assert np.array_equal(r.sequence().forward(good).logits, want)
    assert np.array_equal(r.sequence().forward(np.int64(5)).logits, r.sequence().forward([5]).logits)
    with pytest.raises(errors.TokenOutOfRangeError, match="does not fit an int32"):
        r.sequence().forward([2 ** 70])
    head = BoundaryAdapter(_ReferenceShard(_ReferenceDenseLlama(), 0, 2))
    assert head.forward(token_ids=np.array([1, 2, 3], np.int32)).residual.shape[:2] == (1, 3)


def test_a_batch_of_token_ids_is_refused_not_flattened(model):
    """[2, n] token ids ran as one sequence of 2n tokens: a range runs one sequence, so a
    batch (or another rank) raises ShapeError naming the shape; [n] and [1, n] run."""
    r = mk.Range(model, 0, 5, threads=1)
    batch = np.array([[5, 12, 3], [7, 8, 9]])
    seq = r.sequence()
    with pytest.raises(errors.ShapeError, match=r"\(2, 3\)"):
        seq.forward(batch)
    assert len(seq) == 0
    with pytest.raises(errors.ShapeError, match=r"\(1, 1, 3\)"):
        seq.forward(np.array([[[5, 12, 3]]]))
    with pytest.raises(errors.ShapeError, match=r"\(3, 1\)"):
        seq.forward([[5], [12], [3]])
    with pytest.raises(errors.ShapeError):
        mk.Shard(model, 0, 5, threads=1).forward(batch)
    with pytest.raises(errors.ShapeError):
        BoundaryAdapter(mk.Shard(model, 0, 5, threads=1)).forward(token_ids=batch)
    with pytest.raises(errors.ShapeError):
        mk.Pipeline(model, [2], threads=1).step(batch)
    want = r.sequence().forward([5, 12, 3]).logits.copy()
    assert np.array_equal(r.sequence().forward(batch[:1]).logits, want)
    assert np.array_equal(BoundaryAdapter(mk.Shard(model, 0, 5, threads=1)).forward(token_ids=batch[:1]).logits, want)


def test_strings_with_a_nul_character_are_refused_not_cut(model, tmp_path):
    """C reads a NUL-terminated string up to its first NUL: a request id "a\\0b" went out as
    "a", a path "x.gguf\\0junk" opened x.gguf, backend "cpu\\0x" was cpu. Each such string
    raises ValueError naming the field (certification names fail closed, as uncertified)."""
    from meshkern.boundary import is_certified_architecture

    def refused(field, call):
        with pytest.raises(ValueError, match=f"{field} contains a NUL character"):
            call()

    b = _split(model, [2])[0].sequence().forward([5, 12, 3])
    for f in ("request_id", "recipe_digest", "adapter", "tensor_name", "boundary_point"):
        refused(f"header field {f}", lambda: b.set_header(**{f: "dense-llama\0x"}))
    refused("header field recipe_digest", lambda: BoundaryBundle(residual=np.zeros((1, 2, 64), np.float32),
                                                                 next_layer=3, recipe_digest=model.digest + "\0x"))
    head = mk.Range(model, 0, 2, threads=1)
    bd = head.boundary()
    head.forward_boundary(head.sequence(), [5, 12, 3], out=bd)
    refused("request_id", lambda: bd.set_request("req\0other"))
    for f in ("request_id", "runtime_recipe_digest", "chat_template_id", "chat_template_version", "reasoning_mode"):
        ident = dict(request_id="r", runtime_recipe_digest=model.digest)
        ident[f] = ident.get(f, "") + "\0x"
        refused(f, lambda: mk.tail_result_pack_token(5, identity=ident))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    refused("model path", lambda: mk.Model.open(str(gguf) + "\0junk"))
    refused("tokenizer path", lambda: mk.Tokenizer(str(gguf) + "\0junk"))
    refused("backend", lambda: mk.Range(model, 0, 2, backend="cpu\0x"))
    refused("architecture", lambda: mk.Range(model, 0, 2, architecture="dense-llama\0x"))
    refused("architecture", lambda: mk.Model.random(seed=7, architecture="dense-llama\0x"))
    refused("sampling", lambda: head.forward(head.sequence(), [5], sampling="greedy\0x"))
    refused("seam kind", lambda: mk.Pipeline(model, [2], seam="local\0x"))
    refused("address", lambda: mk.SeamListener("tcp", "127.0.0.1:0\0x"))
    for f in ("psk_hex", "psk_identity", "cert_file", "key_file", "ca_file"):
        refused(f, lambda: mk.SeamListener("tcp", "127.0.0.1:0", **{f: "ab\0cd"}))
    refused("address", lambda: mk.Seam.pair(head, mk.Range(model, 3, 5), "unix", str(tmp_path / "s\0x")))
    refused("rendezvous", lambda: mk.Stage(model, 0, 2, "127.0.0.1:0\0x", [2]))
    with pytest.raises(UncertifiedArchitectureError, match="NUL"):
        certified_architecture("dense-llama\0x")
    assert not is_certified_architecture("dense-llama\0x") and is_certified_architecture("dense-llama")
    with pytest.raises(errors.UncertifiedSamplingError, match="NUL"):
        SamplingContract("greedy\0x")
    b.set_header(request_id="req-1")                       # without a NUL all is as before
    assert b.header.request_id == "req-1"


def test_handles_in_a_garbage_cycle_free_children_first():
    """An exception stored in a frame that holds a range and its sequence makes a garbage
    cycle; the collector clears its objects in any order, and a parent freed before its
    child crashed the child's free (a segfault at gc.collect). Run apart: a crash is a
    failure here, not the end of the suite."""
    import subprocess
    import sys

    code = """
import gc, meshkern as mk
m = mk.Model.random(seed=1)
def make():
    r = mk.Range(m, 0, 5, threads=1)
    s = r.sequence()
    s.forward([1, 2])
    out = s.forward([3])
    b = r.boundary()
    try:
        raise RuntimeError("x")
    except RuntimeError as e:
        err = e  # frame -> err -> traceback -> frame
for i in range(100):
    make()
    if i % 10 == 0:
        gc.collect()
gc.collect()
print("collected")
"""
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "collected" in p.stdout, p.stderr[-2000:]


def test_handles_in_globals_beside_a_function_free_children_first_at_exit():
    """At interpreter exit a script's globals become one garbage cycle when the script has a
    function (it refers to them), and the collector finalized a range before the sequence
    beside it: a segfault at exit. Every handle with parents is freed newest first at exit."""
    import subprocess
    import sys

    code = """
import meshkern as mk
def helper():
    pass
m = mk.Model.random(seed=1)
h, t = mk.Range(m, 0, 2, threads=1), mk.Range(m, 3, 5, threads=1)
s, st = h.sequence(), t.sequence()
out = s.forward([1, 2])
bh, bt = h.boundary(), t.boundary()
h.forward_boundary(s, [3], out=bh)
tx, rx = mk.Seam.pair(h, t, "local")
tx.send(bh)
p = m.pipeline([2], threads=1)
p.step([1, 2])
sched = mk.Scheduler(m, [2], threads=1, max_sequences=1)
sched.submit([1, 2], 3)
print("built")
"""
    for _ in range(3):  # the collector's order varies from run to run
        p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and "built" in p.stdout, p.stderr[-2000:]


def test_threads_sharing_a_range_take_turns(gil_model):
    """A range's forwards share its activations and a sequence's forward, reset and reserve
    its KV blocks (meshkern.h leaves them to one thread at a time); the GIL is released in
    them, so two Python threads overlapped: two sequences of one range decoded wrong tokens
    and a reset during a forward broke the pool's block count. The range's lock makes them
    take turns: each sequence gets the tokens it gets alone, and every block is counted."""
    ids = [1 + i % 40 for i in range(24)]
    ref = mk.Range(gil_model, 0, 3, threads=1, max_context=64).sequence()
    expect = [ref.forward([i]).token_id for i in ids]

    r = mk.Range(gil_model, 0, 3, threads=1, max_context=64)
    seqs = [r.sequence(), r.sequence()]
    got: dict = {0: [], 1: []}

    def decode(k):
        for i in ids:
            got[k].append(seqs[k].forward([i]).token_id)

    threads = [threading.Thread(target=decode, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] == expect and got[1] == expect

    for s in seqs:
        s.reset()
    stop = threading.Event()

    def forward_and_reset(s):
        while not stop.is_set():
            try:
                s.forward([1, 2, 3])
            except errors.ContextOverflowError:
                s.reset()

    def reset(s):
        while not stop.is_set():
            s.reset()

    threads = [threading.Thread(target=f, args=(s,)) for s in seqs for f in (forward_and_reset, reset)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    pool = r.kv_pool
    held = sum(-(-len(s) // pool["block_size"]) for s in seqs)
    assert pool["free_blocks"] == pool["blocks"] - held, (pool, [len(s) for s in seqs])


@pytest.mark.parametrize("kind", ["local", "unix"])
def test_a_receive_for_another_ranges_sequence_leaves_the_message(model, kind):
    """A sequence of another range is refused before anything is received: the message was
    consumed with the refusal (a stream's next receive then waited out its deadline and left
    the seam unusable), now the right receive that follows gets it."""
    head, tail = mk.Range(model, 0, 2, threads=1), mk.Range(model, 3, 5, threads=1)
    other = mk.Range(model, 3, 5, threads=1).sequence()
    tx, rx = mk.Seam.pair(head, tail, kind, io_timeout_ms=1000)
    sh, st = head.sequence(), tail.sequence()
    bo, bi = head.boundary(), tail.boundary()
    head.forward_boundary(sh, [1, 2, 3], out=bo)
    tx.send(bo)
    for wrong in (sh, other):
        with pytest.raises(errors.InvalidArgumentError, match="not this receiving range's"):
            rx.recv(wrong, bi)
    rx.recv(st, bi)
    assert np.array_equal(bi.read(), bo.read())
    assert tail.forward_boundary(st, into=bi).token_id >= 0
