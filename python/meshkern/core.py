"""Models, ranges, sequences, forward passes, bundles, tail results, the tokenizer and
the pipeline, over libmeshkern's public API.

Memory: numpy arrays handed *in* are read by the C call (copied where the C API copies).
Arrays handed *out*:

* ``Bundle.residual`` / ``Bundle.positions`` are **zero-copy views** of the bundle's host
  arrays (writable; they keep the bundle alive).
* ``TailOutput.logits`` / ``TailOutput.token_ids`` are **zero-copy views** of the
  ``mk_tail_output`` arrays (they keep it alive).
* ``Boundary.read()`` (a boundary in backend memory, a device buffer on cuda) is an
  explicit **copy** to host memory.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import threading
from dataclasses import dataclass
from enum import IntEnum
from typing import Iterator, Sequence as Seq

import numpy as np

from ._lib import DEFINES, ffi, lib, string
from .errors import check, raise_status

__all__ = [
    "Role", "seed_hparams", "Model", "Range", "Sequence", "Bundle", "BoundaryHeader", "TailOutput",
    "Boundary", "Tokenizer", "Detokenizer", "Pipeline", "GenerateStats", "tail_result_pack_token",
    "tail_result_pack_logits", "tail_result_validate",
    "Scheduler", "SeqInfo", "Seam", "SeamListener", "Stage",
]


# ------------------------------------------------------------------ helpers ----

def _view(ptr, count: int, dtype, shape, owner) -> np.ndarray:
    """A numpy view of `count` elements at C pointer `ptr` that keeps `owner` alive."""
    if count == 0 or ptr == ffi.NULL:
        return np.zeros(shape, dtype=dtype)
    keep = ffi.gc(ptr, lambda _p, _o=owner: None)  # the buffer holds keep, keep holds owner
    buf = ffi.buffer(keep, count * np.dtype(dtype).itemsize)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


# The destructors of handles with parents, each with its parents and its raw pointer, until
# it has run. When a handle and its parents fall into one garbage cycle (an exception stored
# in a frame that holds a range and its sequence), the collector clears the cycle's objects
# in any order, a function's defaults included: held here, outside the cycle, the destructor
# keeps its parents until it has run, and the child is always freed first.
_PENDING: dict = {}
_PENDING_KEYS = itertools.count()


def _owned(ptr, free, *parents):
    """ffi.gc(ptr, free) whose destructor keeps `parents` (the model of a range, the range
    of a sequence) alive until it has run: neither attribute order nor a garbage cycle can
    free a parent first."""
    if not parents:
        return ffi.gc(ptr, free)
    key = next(_PENDING_KEYS)

    # the defaults keep the parents (and _PENDING) too: at interpreter exit the module's
    # globals may go first. The first call frees; a later one (the collector's, after
    # _free_pending_at_exit) does nothing.
    def release(p, _key=key, _parents=parents, _pending=_PENDING):
        if _pending.pop(_key, None) is not None:
            free(p)

    _PENDING[key] = (release, ptr)  # ptr: the raw pointer, which owns nothing
    return ffi.gc(ptr, release)


@atexit.register
def _free_pending_at_exit() -> None:
    """At interpreter exit every module's globals become one garbage cycle (a module-level
    function refers to its globals), so the collector would finalize a range before the
    sequence still in a global beside it (a segfault at exit). Before that, free every handle
    with parents, children first: a child is always made after its parents, so newest first."""
    for key in sorted(_PENDING, reverse=True):
        entry = _PENDING.get(key)
        if entry is not None:
            release, ptr = entry
            release(ptr)


_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _id_array(token_ids) -> np.ndarray:
    """Token ids as an int64 numpy array of their own shape, or an error: never a silent
    conversion. Only integers are ids (Python ints, numpy integer arrays and scalars): a
    float (1.7 would run token 1; 1.0 is refused too), a bool (numpy's bool dtype, a mask,
    is no integer dtype), a string or anything else raises TypeError naming it. An id that
    does not fit an int32 (it would wrap to another id) raises TokenOutOfRangeError."""
    a = np.asarray(token_ids)
    if a.size == 0:  # [] is float64 to numpy: an empty list of ids is still no ids
        return np.zeros(a.shape, dtype=np.int64)
    if a.dtype.kind not in "iu" and (a.dtype == object or not isinstance(token_ids, (np.ndarray, np.generic))):
        # a list, a Python scalar or an object array: judge each value (numpy types
        # [np.uint64(5), -1] as float64 and ints past int64 as object)
        a = np.asarray(token_ids, dtype=object)
        for x in a.flat:
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"token ids must be integers, got {x!r} ({type(x).__name__})")
            if not _INT32_MIN <= int(x) <= _INT32_MAX:
                raise_status("MK_ERR_TOKEN_OUT_OF_RANGE", f"token id {int(x)} does not fit an int32")
        return np.array([int(x) for x in a.flat], dtype=np.int64).reshape(a.shape)
    if a.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got an array of dtype {a.dtype} "
                        f"(first value {a.flat[0]!r})")
    out = (a > _INT32_MAX) if a.dtype.kind == "u" else (a < _INT32_MIN) | (a > _INT32_MAX)
    if out.any():  # int32 would wrap them to other ids
        raise_status("MK_ERR_TOKEN_OUT_OF_RANGE", f"token id {int(a[out].flat[0])} does not fit an int32")
    return a.astype(np.int64)


def _ids(token_ids) -> tuple[object, int, object]:
    """int32 contiguous ids -> (cdata pointer, n, keepalive array). One sequence: a scalar,
    [n] or [1, n]; a batch [b, n] with b > 1 (or another rank) raises ShapeError, since
    every C call taking ids runs them as one sequence (flattened, [2, n] would be 2n tokens)."""
    a = _id_array(token_ids)
    if a.ndim > 2 or (a.ndim == 2 and a.shape[0] != 1):
        raise_status("MK_ERR_SHAPE", f"token ids of shape {a.shape}: one sequence is [n] or [1, n] "
                                     "(a batch of sequences is several calls)")
    a = np.ascontiguousarray(a.reshape(-1).astype(np.int32))
    if a.size == 0:
        return ffi.NULL, 0, a
    return ffi.cast("const int32_t *", ffi.from_buffer(a)), int(a.size), a


def _token(token) -> int:
    """One token id as a Python int, by the rules of :func:`_id_array`."""
    a = _id_array(token)
    if a.ndim != 0:
        raise TypeError(f"a token id must be one integer, got {token!r}")
    return int(a)


def _cstr(field: str, value) -> bytes:
    """A str (UTF-8) or bytes (a path through os.fsencode) as the bytes of a NUL-terminated
    C string. C reads such a string up to its first NUL, so a value containing one would
    be cut there silently: ValueError naming the field instead."""
    if isinstance(value, str):
        raw = value.encode()
    elif isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    else:
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    if b"\0" in raw:
        raise ValueError(f"{field} contains a NUL character (C would cut it there)")
    return raw


def _bytes_in(data) -> tuple[object, int]:
    """A caller's bytes-like object as (cdata pointer, size in bytes): its byte size, not
    len(), which counts items (a uint32 array's len is a quarter of its bytes)."""
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise ValueError("the bytes must be a C-contiguous buffer")
    return ffi.from_buffer(mv), mv.nbytes


def _name(option: str, value, names: dict):
    """names[value], or ValueError naming the option and the accepted names (for names the C
    library has no parser for; those it parses raise its InvalidArgumentError)."""
    try:
        return names[value]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {option} {value!r} (accepted: {', '.join(names)})") from None


def _seam_kind(name: str) -> int:
    """mk_seam_kind_from_name: an unknown name raises InvalidArgumentError, as Seam does."""
    k = ffi.new("mk_seam_kind *")
    check(lib.mk_seam_kind_from_name(_cstr("seam kind", name), k))
    return int(k[0])


class _Handle:
    """Holds the C handle as ``_ptr``: once closed (None), reading it raises
    ``ValueError("<Class> is closed")`` instead of cffi's TypeError at the C call."""

    __slots__ = ()

    @property
    def _ptr(self):
        p = self.__dict__.get("_handle")
        if p is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return p

    @_ptr.setter
    def _ptr(self, value) -> None:
        self.__dict__["_handle"] = value


def _take_buffer(pp, n: int) -> bytes:
    """Copy a malloc'd (uint8_t*) result out and free it with mk_buffer_free."""
    try:
        return bytes(ffi.buffer(pp[0], n)) if n else b""
    finally:
        lib.mk_buffer_free(pp[0])


_DTYPES = {"f32": 1, "f16": 2, "bf16": 3, "i32": 4, "i64": 5, "native": 6}


class Role(IntEnum):
    """mk_role: which endpoint duties a range owns."""

    HEAD = 1
    MIDDLE = 2
    TAIL = 3
    FULL = 4

    @property
    def owns_embedding(self) -> bool:
        return bool(lib.mk_role_owns_embedding(int(self)))

    @property
    def owns_final_head(self) -> bool:
        return bool(lib.mk_role_owns_final_head(int(self)))

    @property
    def label(self) -> str:
        return string(lib.mk_role_name(int(self)))


_HP_FIELDS = ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate", "rms_eps",
              "rope_theta", "rope_layout", "tied_embeddings", "max_context")


def _hp_to_dict(hp) -> dict:
    d = {f: getattr(hp, f) for f in _HP_FIELDS}
    d["rope_layout"] = "rotate_half" if int(d["rope_layout"]) == 1 else "adjacent_pairs"
    d["tied_embeddings"] = bool(d["tied_embeddings"])
    return d


def seed_hparams() -> dict:
    """mk_hparams_seed_default(): the reference model's shapes."""
    return _hp_to_dict(lib.mk_hparams_seed_default())


# -------------------------------------------------------------------- model ----

class Model(_Handle):
    """A model description and weight source (mk_model): a GGUF file or a seeded random one.

    The C API has no entry point for weights supplied by the caller (named arrays), so a
    model is either :meth:`open` (GGUF) or :meth:`random`.
    """

    def __init__(self, _ptr):
        self._ptr = _ptr

    @classmethod
    def open(cls, path: str) -> "Model":
        out = ffi.new("mk_model **")
        check(lib.mk_model_open_gguf(_cstr("model path", os.fsencode(path)), out))
        return cls(ffi.gc(out[0], lib.mk_model_free))

    @classmethod
    def random(cls, hparams: dict | None = None, *, seed: int = 0, architecture: str = "dense-llama",
               **overrides) -> "Model":
        hp = ffi.new("mk_hparams *", lib.mk_hparams_seed_default())
        for k, v in {**(hparams or {}), **overrides}.items():
            if k == "rope_layout" and isinstance(v, str):
                if v not in ("rotate_half", "adjacent_pairs"):
                    raise ValueError(f"unknown rope layout {v!r}")
                v = 1 if v == "rotate_half" else 2
            setattr(hp, k, v)
        out = ffi.new("mk_model **")
        arch = _cstr("architecture", architecture) if architecture else ffi.NULL
        check(lib.mk_model_create_random(hp, int(seed), arch, out))
        return cls(ffi.gc(out[0], lib.mk_model_free))

    @classmethod
    def from_arrays(cls, tensors: dict, *, n_heads: int, n_kv_heads: int | None = None, rms_eps: float = 1e-6,
                    rope_theta: float = 10000.0, max_context: int = 256, rope_layout: str = "adjacent_pairs",
                    path: str | None = None) -> "Model":
        """A model from named numpy arrays (GGUF llama tensor names, weights [out, in]) and
        hyper-parameters. The C API opens GGUF files only, so the arrays are written to a
        GGUF file of F32 tensors (``path``, or a temporary file removed with the model) and
        opened with mk_model_open_gguf. rope_layout="rotate_half" converts the Q/K rows of a
        Hugging-Face-style model (see :mod:`meshkern.gguf`)."""
        import os
        import tempfile
        import weakref

        from .gguf import write_gguf

        temp = path is None
        if temp:
            fd, path = tempfile.mkstemp(suffix=".gguf", prefix="meshkern-")
            os.close(fd)
        try:
            write_gguf(path, tensors, n_heads=n_heads, n_kv_heads=n_kv_heads, rms_eps=rms_eps, rope_theta=rope_theta,
                       max_context=max_context, rope_layout=rope_layout)
            model = cls.open(path)
        except BaseException:
            if temp:
                os.unlink(path)
            raise
        if temp:
            weakref.finalize(model._ptr, os.unlink, path)
        return model

    def close(self) -> None:
        """Release the model now (ranges built over it keep it alive until they go)."""
        self._ptr = None  # freed once no range, sequence or view still needs it

    @property
    def hparams(self) -> dict:
        return _hp_to_dict(lib.mk_model_hparams(self._ptr)[0])

    @property
    def n_layers(self) -> int:
        return int(lib.mk_model_hparams(self._ptr).n_layers)

    @property
    def architecture(self) -> str:
        return string(lib.mk_model_architecture(self._ptr))

    @property
    def digest(self) -> str:
        return string(lib.mk_model_digest(self._ptr))

    def range(self, start: int, end: int, **options) -> "Range":
        return Range(self, start, end, **options)

    def pipeline(self, cuts: Seq[int] = (), **options) -> "Pipeline":
        return Pipeline(self, cuts, **options)

    def tokenizer(self) -> "Tokenizer":
        return Tokenizer(self)


def _range_options(backend="cpu", device=0, weight_dtype=None, threads=0, kv_dtype=None, max_context=0,
                   max_batch_tokens=0, token_only=False, architecture=None, speed_mode=None, max_batch_sequences=0,
                   kv_block_size=0, kv_pool_blocks=0, kv_pool_bytes=0):
    o = ffi.new("mk_range_options *", lib.mk_range_options_default())
    keep = []
    kind = ffi.new("mk_backend_kind *")
    check(lib.mk_backend_kind_from_name(_cstr("backend", backend), kind))
    o.backend = lib.mk_backend_config_default(kind[0])
    o.backend.device = device
    if weight_dtype is not None:
        o.backend.weight_dtype = _name("weight_dtype", weight_dtype, _DTYPES) if isinstance(weight_dtype, str) \
            else weight_dtype
    if kv_dtype is not None:
        o.backend.kv_dtype = _name("kv_dtype", kv_dtype, _DTYPES) if isinstance(kv_dtype, str) else kv_dtype
    if speed_mode is not None:
        o.backend.speed_mode = speed_mode
    o.backend.threads = threads
    o.max_context = max_context
    o.max_batch_tokens = max_batch_tokens
    o.max_batch_sequences = max_batch_sequences
    o.kv_block_size = kv_block_size
    o.kv_pool_blocks = kv_pool_blocks
    o.kv_pool_bytes = kv_pool_bytes
    o.token_only = token_only
    if architecture is not None:
        keep.append(ffi.new("char[]", _cstr("architecture", architecture)))
        o.architecture = keep[-1]
    return o, keep


# -------------------------------------------------------------------- range ----

class Range(_Handle):
    """Layers [start, end] (inclusive) of a model on a backend (mk_range).

    Options: backend ("cpu"/"cuda"), device, weight_dtype ("f32", "f16", "bf16", "native"),
    threads, kv_dtype, max_context, max_batch_tokens, max_batch_sequences, token_only,
    architecture (advertised); the paged KV cache: kv_block_size (positions per block),
    kv_pool_blocks or kv_pool_bytes (the pool's size).
    """

    def __init__(self, model: Model, start: int, end: int, **options):
        self.model = model
        o, keep = _range_options(**options)
        out = ffi.new("mk_range **")
        check(lib.mk_range_create(model._ptr, int(start), int(end), o, out))
        self._ptr = _owned(out[0], lib.mk_range_free, model._ptr)
        # The C library leaves a range's forwards (they share its activations) and a sequence's
        # forward, reset and reserve to one thread at a time (meshkern.h); the GIL is released
        # in them, so threads would overlap: this lock makes them take turns.
        self._lock = threading.Lock()

    def close(self) -> None:
        self._ptr = None  # freed once no range, sequence or view still needs it

    @property
    def role(self) -> Role:
        return Role(lib.mk_range_role(self._ptr))

    @property
    def kv_pool(self) -> dict:
        """The range's KV pool (mk_range_kv_pool): block_size, block_bytes, blocks,
        free_blocks, promised_blocks."""
        info = ffi.new("mk_kv_pool_info *")
        check(lib.mk_range_kv_pool(self._ptr, info))
        return {k: int(getattr(info, k)) for k in ("block_size", "block_bytes", "blocks", "free_blocks",
                                                   "promised_blocks")}

    @property
    def start(self) -> int:
        return int(lib.mk_range_start(self._ptr))

    @property
    def end(self) -> int:
        return int(lib.mk_range_end(self._ptr))

    @property
    def weight_bytes(self) -> int:
        return int(lib.mk_range_weight_bytes(self._ptr))

    @property
    def recipe_digest(self) -> str:
        return string(lib.mk_range_recipe_digest(self._ptr))

    def sequence(self) -> "Sequence":
        return Sequence(self)

    def forward(self, seq: "Sequence", token_ids=None, bundle: "Bundle | None" = None, *,
                sampling: str | None = None) -> "Bundle | TailOutput":
        """One forward step (the GIL is released during it). Exactly one of token_ids /
        bundle, as the role requires; a non-tail range returns a :class:`Bundle`, a
        tail/full range a :class:`TailOutput`."""
        ids, n, _keep = _ids(token_ids) if token_ids is not None else (ffi.NULL, 0, None)
        samp = ffi.NULL
        if sampling is not None:
            samp = ffi.new("mk_sampling_contract *")
            check(lib.mk_sampling_contract_from_name(samp, _cstr("sampling", sampling)))
        ob = ffi.new("mk_bundle **")
        ot = ffi.new("mk_tail_output **")
        with self._lock:
            check(lib.mk_range_forward(self._ptr, seq._ptr, ids, n, bundle._ptr if bundle is not None else ffi.NULL,
                                       samp, ob, ot))
        if ot[0] != ffi.NULL:
            return TailOutput(ffi.gc(ot[0], lib.mk_tail_output_free))
        return Bundle(ffi.gc(ob[0], lib.mk_bundle_free))

    def forward_boundary(self, seq: "Sequence", token_ids=None, into: "Boundary | None" = None, *,
                         out: "Boundary | None" = None, sampling: str | None = None) -> "TailOutput | None":
        """mk_range_forward_boundary: input token ids or a received boundary of this range
        (``into``); a non-tail range writes its residual into ``out`` (a boundary of this
        range) and returns None, a tail range returns a :class:`TailOutput`."""
        ids, n, _keep = _ids(token_ids) if token_ids is not None else (ffi.NULL, 0, None)
        samp = ffi.NULL
        if sampling is not None:
            samp = ffi.new("mk_sampling_contract *")
            check(lib.mk_sampling_contract_from_name(samp, _cstr("sampling", sampling)))
        ot = ffi.new("mk_tail_output **")
        with self._lock:
            check(lib.mk_range_forward_boundary(self._ptr, seq._ptr, ids, n,
                                                into._ptr if into is not None else ffi.NULL, samp,
                                                out._ptr if out is not None else ffi.NULL, ot))
        if ot[0] != ffi.NULL:
            return TailOutput(ffi.gc(ot[0], lib.mk_tail_output_free))
        return None

    def boundary(self) -> "Boundary":
        return Boundary(self)

    def check_boundary(self, seq: "Sequence", header: "BoundaryHeader") -> None:
        """mk_range_check_boundary: the contract on a header alone (raises on refusal)."""
        check(lib.mk_range_check_boundary(self._ptr, seq._ptr, header._to_c()))


class Sequence(_Handle):
    """A sequence (KV cache) of one range (mk_sequence)."""

    def __init__(self, rng: Range):
        self.range = rng
        out = ffi.new("mk_sequence **")
        check(lib.mk_sequence_open(rng._ptr, out))
        self._ptr = _owned(out[0], lib.mk_sequence_close, rng._ptr)

    def close(self) -> None:
        self._ptr = None  # freed once no range, sequence or view still needs it

    def reset(self) -> None:
        with self.range._lock:  # not during a forward of this sequence on another thread
            check(lib.mk_sequence_reset(self._ptr))

    def reserve(self, positions: int) -> None:
        """mk_sequence_reserve: the pool sets aside the blocks of `positions` positions for
        this sequence (raises KvPoolFullError when it cannot)."""
        with self.range._lock:
            check(lib.mk_sequence_reserve(self._ptr, int(positions)))

    def __len__(self) -> int:
        return int(lib.mk_sequence_length(self._ptr))

    def forward(self, token_ids=None, bundle: "Bundle | None" = None, **kw):
        return self.range.forward(self, token_ids, bundle, **kw)


# ------------------------------------------------------------------- bundle ----

_ARCH_NAMES = {1: "dense", 2: "moe", 3: "mla"}
_ARCH_CODES = {v: k for k, v in _ARCH_NAMES.items()}


@dataclass
class BoundaryHeader:
    """mk_boundary_header as a Python dataclass (a copy)."""

    schema_version: int
    architecture: str
    adapter: str
    tensor_name: str
    boundary_point: str
    next_layer: int
    normalized: bool
    recipe_digest: str
    request_id: str
    batch: int
    rows: int
    hidden: int
    dtype: str
    step: int
    position: int

    @classmethod
    def _from_c(cls, h) -> "BoundaryHeader":
        return cls(schema_version=int(h.schema_version), architecture=_ARCH_NAMES.get(int(h.architecture), "?"),
                   adapter=string(h.adapter), tensor_name=string(h.tensor_name),
                   boundary_point=string(h.boundary_point), next_layer=int(h.next_layer),
                   normalized=bool(h.normalized), recipe_digest=string(h.recipe_digest),
                   request_id=string(h.request_id), batch=int(h.batch), rows=int(h.rows), hidden=int(h.hidden),
                   dtype=string(lib.mk_dtype_name(h.dtype)), step=int(h.step), position=int(h.position))

    def _to_c(self):
        h = ffi.new("mk_boundary_header *")
        h.schema_version = self.schema_version
        h.architecture = _ARCH_CODES.get(self.architecture, 0)
        for name in ("adapter", "tensor_name", "boundary_point", "recipe_digest", "request_id"):
            raw = _cstr(f"header field {name}", getattr(self, name))
            size = ffi.sizeof(getattr(h, name))
            if len(raw) >= size:
                raise ValueError(f"header field {name} longer than {size - 1} bytes")
            ffi.memmove(getattr(h, name), raw + b"\0", len(raw) + 1)
        h.next_layer = self.next_layer
        h.normalized = self.normalized
        h.batch, h.rows, h.hidden = self.batch, self.rows, self.hidden
        h.dtype = _DTYPES.get(self.dtype, 0)
        h.step, h.position = self.step, self.position
        return h


class Bundle(_Handle):
    """A boundary in host memory (mk_bundle): header + residual [batch, rows, hidden] f32 +
    positions [batch, rows] i32. ``residual`` and ``positions`` are zero-copy, writable views."""

    def __init__(self, _ptr):
        self._ptr = _ptr

    @classmethod
    def create(cls, batch: int, seq: int, hidden: int) -> "Bundle":
        out = ffi.new("mk_bundle **")
        check(lib.mk_bundle_create(batch, seq, hidden, out))
        return cls(ffi.gc(out[0], lib.mk_bundle_free))

    @classmethod
    def from_bytes(cls, data: bytes) -> "Bundle":
        """mk_bundle_unpack: parse and validate protobuf TensorBundle bytes."""
        out = ffi.new("mk_bundle **")
        check(lib.mk_bundle_unpack(*_bytes_in(data), out))
        return cls(ffi.gc(out[0], lib.mk_bundle_free))

    unpack = from_bytes

    def to_bytes(self) -> bytes:
        """mk_bundle_pack: the protobuf TensorBundle bytes."""
        pp = ffi.new("uint8_t **")
        n = ffi.new("size_t *")
        check(lib.mk_bundle_pack(self._ptr, pp, n))
        return _take_buffer(pp, n[0])

    pack = to_bytes

    def unpack_into(self, data: bytes) -> None:
        """mk_bundle_unpack_into: decode bytes into this bundle (reused across steps)."""
        check(lib.mk_bundle_unpack_into(*_bytes_in(data), self._ptr))

    def clone(self) -> "Bundle":
        out = ffi.new("mk_bundle **")
        check(lib.mk_bundle_clone(self._ptr, out))
        return Bundle(ffi.gc(out[0], lib.mk_bundle_free))

    def close(self) -> None:
        self._ptr = None  # freed once no range, sequence or view still needs it

    @property
    def header(self) -> BoundaryHeader:
        return BoundaryHeader._from_c(lib.mk_bundle_header_of(self._ptr)[0])

    @header.setter
    def header(self, h: BoundaryHeader) -> None:
        check(lib.mk_bundle_set_header(self._ptr, h._to_c()))

    def set_header(self, **fields) -> None:
        """Replace identity fields of the header (batch, rows, hidden, dtype must stay)."""
        h = self.header
        for k, v in fields.items():
            if not hasattr(h, k):
                raise AttributeError(k)
            setattr(h, k, v)
        self.header = h

    @property
    def residual(self) -> np.ndarray:
        h = lib.mk_bundle_header_of(self._ptr)
        shape = (int(h.batch), int(h.rows), int(h.hidden))
        return _view(lib.mk_bundle_residual(self._ptr), shape[0] * shape[1] * shape[2], np.float32, shape, self._ptr)

    @property
    def positions(self) -> np.ndarray:
        h = lib.mk_bundle_header_of(self._ptr)
        shape = (int(h.batch), int(h.rows))
        return _view(lib.mk_bundle_positions(self._ptr), shape[0] * shape[1], np.int32, shape, self._ptr)

    def tensor_fields(self) -> dict:
        """mk_bundle_tensor_fields: name, dtype, shape, byte_order as on the wire."""
        f = ffi.new("mk_tensor_fields *")
        check(lib.mk_bundle_tensor_fields(self._ptr, f))
        return {"name": string(f.name), "dtype": string(lib.mk_dtype_name(f.dtype)),
                "shape": [int(f.shape[i]) for i in range(f.rank)], "byte_order": string(f.byte_order)}


# --------------------------------------------------------------- tail output ----

class TailOutput(_Handle):
    """A tail range's output (mk_tail_output): logits [batch, vocab] (None when the range is
    token_only) and the sampled token ids [batch], both zero-copy views."""

    def __init__(self, _ptr):
        self._ptr = _ptr
        t = _ptr
        self.batch, self.vocab = int(t.batch), int(t.vocab)
        self.logits = (None if t.logits == ffi.NULL else
                       _view(t.logits, self.batch * self.vocab, np.float32, (self.batch, self.vocab), _ptr))
        self.token_ids = _view(t.token_ids, self.batch, np.int32, (self.batch,), _ptr)
        self.sampling_mode = string(lib.mk_sampling_mode_name(t.sampling.mode))

    @property
    def token_id(self) -> int:
        return int(self.token_ids[0])


# ---------------------------------------------------------------- boundaries ----

class Boundary(_Handle):
    """A boundary whose payload stays in a range's backend memory (mk_boundary)."""

    def __init__(self, rng: Range):
        self.range = rng
        out = ffi.new("mk_boundary **")
        check(lib.mk_boundary_create(rng._ptr, out))
        self._ptr = _owned(out[0], lib.mk_boundary_free, rng._ptr)

    @property
    def header(self) -> BoundaryHeader:
        return BoundaryHeader._from_c(lib.mk_boundary_header_of(self._ptr)[0])

    def set_request(self, request_id: str, step: int = 0) -> None:
        """Name the sequence the rows belong to, as a batch's entries need
        (mk_boundary_set_request); after the forward that filled the boundary."""
        check(lib.mk_boundary_set_request(self._ptr, _cstr("request_id", request_id), int(step)))

    def read(self) -> np.ndarray:
        """Copy the payload to host memory: residual [rows, hidden] (an explicit copy)."""
        h = lib.mk_boundary_header_of(self._ptr)
        out = np.empty((int(h.rows), int(h.hidden)), dtype=np.float32)
        check(lib.mk_boundary_read(self._ptr, ffi.cast("float *", ffi.from_buffer(out)), out.size))
        return out


# ------------------------------------------------------------- tail results ----

def _identity(request_id, runtime_recipe_digest, chat_template_id="", chat_template_version="",
              reasoning_mode="", architecture="dense"):
    keep = [ffi.new("char[]", _cstr(f, s)) for f, s in
            (("request_id", request_id), ("runtime_recipe_digest", runtime_recipe_digest),
             ("chat_template_id", chat_template_id), ("chat_template_version", chat_template_version),
             ("reasoning_mode", reasoning_mode))]
    ident = ffi.new("mk_request_identity *")
    ident.request_id, ident.runtime_recipe_digest, ident.chat_template_id, ident.chat_template_version, \
        ident.reasoning_mode = keep
    ident.architecture = _name("architecture", architecture, _ARCH_CODES)
    return ident, keep


def _sampling(temperature=0.0, top_p=1.0, top_k=0, seed=0):
    s = ffi.new("mk_sampling_params *")
    s.temperature, s.top_p, s.top_k, s.seed = temperature, top_p, top_k, seed
    return s


def tail_result_pack_token(token_id: int, *, identity: dict, sampling: dict | None = None) -> bytes:
    """A TailResult carrying a sampled token (mk_tail_result_pack_token)."""
    ident, _keep = _identity(**identity)
    pp, n = ffi.new("uint8_t **"), ffi.new("size_t *")
    check(lib.mk_tail_result_pack_token(ident, _sampling(**(sampling or {})), _token(token_id), pp, n))
    return _take_buffer(pp, n[0])


def tail_result_pack_logits(logits: np.ndarray, *, identity: dict, sampling: dict | None = None) -> bytes:
    """A TailResult carrying a logits bundle [batch, vocab] (mk_tail_result_pack_logits)."""
    a = np.asarray(logits, dtype=np.float32)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:  # None (a token_only output) or another rank: never a guessed [batch, vocab]
        raise_status("MK_ERR_SHAPE", f"logits must be [batch, vocab], got shape {a.shape}")
    a = np.ascontiguousarray(a)
    ident, _keep = _identity(**identity)
    pp, n = ffi.new("uint8_t **"), ffi.new("size_t *")
    check(lib.mk_tail_result_pack_logits(ident, _sampling(**(sampling or {})), ffi.cast("float *", ffi.from_buffer(a)),
                                         a.shape[0], a.shape[1], pp, n))
    return _take_buffer(pp, n[0])


def tail_result_validate(data: bytes) -> dict:
    """Parse and validate TailResult bytes (mk_tail_result_validate)."""
    info = ffi.new("mk_tail_result_info *")
    check(lib.mk_tail_result_validate(*_bytes_in(data), info))
    return {"kind": "token" if info.kind == 1 else "logits", "token_id": int(info.token_id),
            "batch": int(info.batch), "vocab": int(info.vocab), "greedy": bool(info.greedy),
            "architecture": _ARCH_NAMES.get(int(info.architecture), "?"), "request_id": string(info.request_id),
            "runtime_recipe_digest": string(info.runtime_recipe_digest)}


# ---------------------------------------------------------------- tokenizer ----

class Tokenizer(_Handle):
    """The model's own tokenizer (mk_tokenizer), from a Model or a GGUF path."""

    def __init__(self, source: "Model | str"):
        out = ffi.new("mk_tokenizer **")
        if isinstance(source, Model):
            check(lib.mk_tokenizer_open(source._ptr, out))
        else:
            check(lib.mk_tokenizer_open_file(_cstr("tokenizer path", os.fsencode(source)), out))
        self._ptr = ffi.gc(out[0], lib.mk_tokenizer_free)

    @property
    def vocab_size(self) -> int:
        return int(lib.mk_tokenizer_vocab_size(self._ptr))

    @property
    def bos(self) -> int:
        return int(lib.mk_tokenizer_bos(self._ptr))

    @property
    def eos(self) -> int:
        return int(lib.mk_tokenizer_eos(self._ptr))

    def is_eog(self, token: int) -> bool:
        return bool(lib.mk_tokenizer_is_eog(self._ptr, _token(token)))

    def token_text(self, token: int) -> str | None:
        p = lib.mk_tokenizer_token_text(self._ptr, _token(token))
        return None if p == ffi.NULL else string(p)

    @staticmethod
    def _flags(add_special: bool, parse_special: bool) -> int:
        return (DEFINES["MK_TOKENIZE_ADD_SPECIAL"] if add_special else 0) | \
               (DEFINES["MK_TOKENIZE_PARSE_SPECIAL"] if parse_special else 0)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        pp, n = ffi.new("int32_t **"), ffi.new("size_t *")
        check(lib.mk_tokenizer_encode(self._ptr, raw, len(raw), self._flags(add_special, parse_special), pp, n))
        try:
            return [int(x) for x in ffi.unpack(pp[0], n[0])] if n[0] else []
        finally:
            lib.mk_buffer_free(pp[0])

    def count(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> int:
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = ffi.new("size_t *")
        check(lib.mk_tokenizer_count(self._ptr, raw, len(raw), self._flags(add_special, parse_special), n))
        return int(n[0])

    def decode(self, ids, *, special: bool = False) -> str:
        p, n, _keep = _ids(ids)
        pp, ln = ffi.new("char **"), ffi.new("size_t *")
        check(lib.mk_tokenizer_decode(self._ptr, p, n, DEFINES["MK_DECODE_SPECIAL"] if special else 0, pp, ln))
        return _take_buffer(ffi.cast("uint8_t **", pp), ln[0]).decode("utf-8", "replace")

    def detokenizer(self, *, special: bool = False) -> "Detokenizer":
        return Detokenizer(self, special=special)

    @property
    def chat_template(self) -> str:
        """The kind of the model's chat template ("chatml", ...); raises ChatTemplateError."""
        k = ffi.new("mk_chat_template_kind *")
        check(lib.mk_chat_template_detect(self._ptr, k))
        return string(lib.mk_chat_template_name(k[0]))

    @staticmethod
    def _messages(messages: Seq[dict]):
        """[{"role": ..., "content": ...}, ...] as an mk_chat_message array, and what keeps its
        strings alive."""
        msgs = ffi.new("mk_chat_message[]", max(1, len(messages)))
        keep = []
        for i, m in enumerate(messages):
            keep.append(ffi.new("char[]", _cstr(f"message {i} role", m["role"])))
            keep.append(ffi.new("char[]", _cstr(f"message {i} content", m["content"])))
            msgs[i].role, msgs[i].content = keep[-2], keep[-1]
        return msgs, keep

    def apply_chat(self, messages: Seq[dict], *, add_generation_prompt: bool = True) -> str:
        """Render [{"role": ..., "content": ...}, ...] as the model's template does."""
        msgs, _keep = self._messages(messages)
        pp, ln = ffi.new("char **"), ffi.new("size_t *")
        check(lib.mk_chat_apply(self._ptr, msgs, len(messages), add_generation_prompt, pp, ln))
        return _take_buffer(ffi.cast("uint8_t **", pp), ln[0]).decode("utf-8")

    def encode_chat(self, messages: Seq[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """The conversation as the model reads it (mk_chat_encode): apply_chat's markup with its
        control tokens, each content as plain text ("<|im_end|>" inside a message stays text)."""
        msgs, _keep = self._messages(messages)
        pp, n = ffi.new("int32_t **"), ffi.new("size_t *")
        check(lib.mk_chat_encode(self._ptr, msgs, len(messages), add_generation_prompt, pp, n))
        try:
            return [int(x) for x in ffi.unpack(pp[0], n[0])] if n[0] else []
        finally:
            lib.mk_buffer_free(pp[0])


class Detokenizer(_Handle):
    """Streaming decode (mk_detokenizer): push tokens, get the text completed so far."""

    def __init__(self, tok: Tokenizer, *, special: bool = False):
        self.tokenizer = tok
        out = ffi.new("mk_detokenizer **")
        check(lib.mk_detokenizer_create(tok._ptr, DEFINES["MK_DECODE_SPECIAL"] if special else 0, out))
        self._ptr = _owned(out[0], lib.mk_detokenizer_free, tok._ptr)
        self._text = ffi.new("const char **")
        self._len = ffi.new("size_t *")

    def push(self, token: int) -> str:
        check(lib.mk_detokenizer_push(self._ptr, _token(token), self._text, self._len))
        return ffi.unpack(self._text[0], self._len[0]).decode("utf-8") if self._len[0] else ""

    def flush(self) -> str:
        check(lib.mk_detokenizer_flush(self._ptr, self._text, self._len))
        return ffi.unpack(self._text[0], self._len[0]).decode("utf-8") if self._len[0] else ""


# ----------------------------------------------------------------- pipeline ----

@dataclass
class GenerateStats:
    n_prompt: int = 0
    n_generated: int = 0
    stopped_at_eog: bool = False
    eog_token: int = -1
    prefill_s: float = 0.0
    decode_s: float = 0.0


class Pipeline(_Handle):
    """A model as a chain of ranges in this process (mk_pipeline). cuts[i] is the last layer
    of range i; no cuts = one FULL range. ``seam``: the transport of every seam, "local"
    (the default), "wire" (packed to bytes and unpacked), "unix", "tcp", "nccl";
    ``devices``: one device per range (the cuda backend)."""

    def __init__(self, model: Model, cuts: Seq[int] = (), *, seam: str = "local", devices: Seq[int] | None = None,
                 **options):
        self.model = model
        ro, keep = _range_options(**options)
        so = ffi.new("mk_seam_options *", lib.mk_seam_options_default(_seam_kind(seam)))
        po = ffi.new("mk_pipeline_options *", lib.mk_pipeline_options_default())
        c = ffi.new("int64_t[]", [int(x) for x in cuts] or [0])
        po.range, po.seam, po.cuts, po.n_cuts = ro, so, c, len(cuts)
        if devices is not None:
            d = ffi.new("int[]", [int(x) for x in devices] or [0])
            po.devices, po.n_devices = d, len(devices)
        out = ffi.new("mk_pipeline **")
        check(lib.mk_pipeline_create(model._ptr, po, out))
        self._ptr = _owned(out[0], lib.mk_pipeline_free, model._ptr)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._ptr = None  # freed once no range, sequence or view still needs it

    @property
    def n_ranges(self) -> int:
        return int(lib.mk_pipeline_range_count(self._ptr))

    def range_bounds(self) -> list[tuple[int, int]]:
        return [(int(lib.mk_range_start(lib.mk_pipeline_range(self._ptr, i))),
                 int(lib.mk_range_end(lib.mk_pipeline_range(self._ptr, i)))) for i in range(self.n_ranges)]

    @property
    def seam_bytes(self) -> int:
        return int(lib.mk_pipeline_seam_bytes(self._ptr))

    def range_seconds(self, index: int) -> float:
        return float(lib.mk_pipeline_range_seconds(self._ptr, index))

    def step(self, token_ids) -> TailOutput:
        """Feed tokens to the head, carry the residual to the tail (GIL released)."""
        p, n, _keep = _ids(token_ids)
        out = ffi.new("mk_tail_output **")
        with self._lock:
            check(lib.mk_pipeline_step(self._ptr, p, n, out))
        return TailOutput(ffi.gc(out[0], lib.mk_tail_output_free))

    def reset(self) -> None:
        with self._lock:  # not under a generation still running on its worker
            check(lib.mk_pipeline_reset(self._ptr))

    def generate(self, prompt_ids, max_new: int = 32, *, tokenizer: Tokenizer | None = None,
                 stats: GenerateStats | None = None) -> Iterator[int]:
        """Greedy generation (mk_pipeline_generate) as an iterator of token ids. It runs on a
        worker thread (the GIL is released in C) and stops at the tokenizer's
        end-of-generation set or after max_new tokens; closing the iterator early stops it
        (the worker runs ahead: the KV cache then holds tokens past the last one taken, so
        reset() before another prompt)."""
        p, n, keep = _ids(prompt_ids)
        q: queue.Queue = queue.Queue()
        stop = threading.Event()
        STOP = 4  # MK_ERR_INTERNAL: any non-OK status stops mk_pipeline_generate

        @ffi.callback("mk_status(void *, int32_t, const float *, size_t)")
        def on_token(_user, token, _logits, _vocab):
            if stop.is_set():
                return STOP
            q.put(int(token))
            return 0

        st = ffi.new("mk_generate_stats *")
        result: list = []

        def worker():
            try:
                with self._lock:
                    status = lib.mk_pipeline_generate(self._ptr, tokenizer._ptr if tokenizer else ffi.NULL, p, n,
                                                      max_new, on_token, ffi.NULL, st)
                    msg = string(lib.mk_last_error()) if status else ""
                result.append((status, msg))
            except BaseException as e:  # a bad argument: raised by the iterator, never left hanging
                result.append(e)
            finally:
                q.put(None)

        t = threading.Thread(target=worker, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    break
                yield item
        finally:
            stop.set()
            t.join()
            _ = (keep, on_token)
        if isinstance(result[0], BaseException):
            raise result[0]
        status, msg = result[0]
        if stats is not None:
            for f in ("n_prompt", "n_generated", "stopped_at_eog", "eog_token", "prefill_s", "decode_s"):
                setattr(stats, f, getattr(st, f))
        # Reached only when the worker ended on its own (a consumer that closes the iterator
        # early leaves at the yield), so any status here is the C call's own failure.
        if status:
            from .errors import error_for
            raise error_for(status, msg)

    def generate_text(self, tokenizer: Tokenizer, prompt: "str | Seq[dict]", max_new: int = 32, *,
                      chat: bool = True, stats: GenerateStats | None = None) -> Iterator[str]:
        """Generation as an iterator of text pieces. ``prompt``: a list of chat messages, or a
        string (rendered as one user message through the chat template when chat=True)."""
        if isinstance(prompt, str):
            ids = tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat else tokenizer.encode(prompt)
        else:
            ids = tokenizer.encode_chat(prompt)
        d = tokenizer.detokenizer()
        for tok in self.generate(ids, max_new, tokenizer=tokenizer, stats=stats):
            piece = d.push(tok)
            if piece:
                yield piece
        tail = d.flush()
        if tail:
            yield tail


# ---------------------------------------------------------------- scheduler ----

_SEQ_STATES = {1: "queued", 2: "running", 3: "done", 4: "failed"}


@dataclass
class SeqInfo:
    """mk_seq_info plus the tokens generated so far."""

    state: str
    status: str
    n_tokens: int
    stopped: bool
    error: str
    tokens: list


class Scheduler(_Handle):
    """Many sequences through a model cut into ranges, one worker thread per range
    (mk_sched). ``cuts`` (last layer of each range but the last) or ``n_workers`` with
    balanced cuts (mk_split_auto); ``seam``: None (the placement rule) or "local", "wire",
    "unix", "tcp", "nccl"; other keywords are range options (backend, threads, ...).
    A sequence runs to its stop id or limit unless cancelled (``cancel``); ``release``
    frees a read sequence's record."""

    def __init__(self, model: Model, cuts: Seq[int] | None = None, *, n_workers: int = 0, max_sequences: int = 8,
                 seam: str | None = None, devices: Seq[int] | None = None, on_token=None, **options):
        """``on_token(seq_id, index, token, logits)``, optional, is called on the tail
        worker's thread for each generated token in order per sequence (logits [vocab] is a
        copy, or None for token_only ranges); it must not call back into the scheduler.
        An exception it raises cannot reach the C worker: the first one is kept (later ones
        are dropped until it is raised) and raised by the next :meth:`wait` or
        :meth:`wait_all` call, which clears it; the sequences are not stopped by it."""
        self.model = model
        o = ffi.new("mk_sched_options *", lib.mk_sched_options_default())
        self._on_token = None
        # the first exception of on_token, until wait/wait_all raises it (not self: no cycle)
        self._cb_error: list = []
        self._cb_lock = threading.Lock()
        if on_token is not None:
            cb_error, cb_lock = self._cb_error, self._cb_lock

            @ffi.callback("void(void *, uint64_t, size_t, int32_t, const float *, size_t)")
            def _cb(_user, seq_id, index, token, logits, vocab):
                try:
                    lg = None if logits == ffi.NULL else np.frombuffer(ffi.buffer(logits, vocab * 4), np.float32).copy()
                    on_token(int(seq_id), int(index), int(token), lg)
                except BaseException as e:  # noqa: BLE001 - never into C: raised by the next wait
                    with cb_lock:
                        if not cb_error:
                            cb_error.append(e)

            self._on_token = _cb
            o.on_token = _cb
        ro, self._keep = _range_options(**options)
        o.range = ro[0]
        if cuts is None:
            o.split_auto = True
            o.n_workers = n_workers
        else:
            self._cuts = ffi.new("int64_t[]", [int(c) for c in cuts] or [0])
            o.cuts, o.n_cuts = self._cuts, len(cuts)
        if devices is not None:
            self._devices = ffi.new("int[]", list(devices))
            o.devices, o.n_devices = self._devices, len(devices)
        o.max_sequences = max_sequences
        if seam is not None:
            o.seam = _seam_kind(seam)
        out = ffi.new("mk_sched **")
        check(lib.mk_sched_create(model._ptr, o, out))
        # the workers may call on_token until mk_sched_free: the callback outlives them
        self._ptr = _owned(out[0], lib.mk_sched_free, model._ptr, self._on_token)

    def close(self) -> None:
        self._ptr = None

    @property
    def n_workers(self) -> int:
        return int(lib.mk_sched_worker_count(self._ptr))

    def worker_bounds(self) -> list[tuple[int, int]]:
        return [(int(lib.mk_range_start(lib.mk_sched_worker_range(self._ptr, i))),
                 int(lib.mk_range_end(lib.mk_sched_worker_range(self._ptr, i)))) for i in range(self.n_workers)]

    def seam_kind(self, seam: int) -> str:
        return string(lib.mk_seam_kind_name(lib.mk_sched_seam_kind(self._ptr, seam)))

    def submit(self, prompt, max_new_tokens: int = 16, stop_ids=()) -> int:
        p, n, _k1 = _ids(prompt)
        s, ns, _k2 = _ids(list(stop_ids))
        sid = ffi.new("uint64_t *")
        check(lib.mk_sched_submit(self._ptr, p, n, max_new_tokens, s, ns, sid))
        return int(sid[0])

    def poll(self, seq_id: int, cap: int = 4096) -> SeqInfo:
        info = ffi.new("mk_seq_info *")
        toks = ffi.new("int32_t[]", cap)
        check(lib.mk_sched_poll(self._ptr, seq_id, info, toks, cap))
        n = min(int(info.n_tokens), cap)
        return SeqInfo(_SEQ_STATES.get(int(info.state), "?"), string(lib.mk_status_name(info.status)),
                       int(info.n_tokens), bool(info.stopped), string(info.error), list(toks[0:n]))

    def _raise_callback_error(self) -> None:
        """Raise (and clear) the first exception on_token raised since the last wait."""
        with self._cb_lock:
            err = self._cb_error.pop() if self._cb_error else None
        if err is not None:
            raise err

    def wait(self, seq_id: int) -> SeqInfo:
        """Block (GIL released) until the sequence is done or failed. Raises the first
        exception on_token raised since the last wait / wait_all (then cleared)."""
        check(lib.mk_sched_wait(self._ptr, seq_id))
        self._raise_callback_error()
        info = self.poll(seq_id)
        if info.n_tokens > len(info.tokens):  # longer than poll's default cap: all of them
            info = self.poll(seq_id, info.n_tokens)
        return info

    def wait_all(self) -> None:
        """Block until every sequence is done or failed; raises as :meth:`wait` does."""
        check(lib.mk_sched_wait_all(self._ptr))
        self._raise_callback_error()

    def cancel(self, seq_id: int) -> None:
        """Stop a sequence early (mk_sched_cancel): a queued one leaves the queue, a running
        one retires after the step in flight; it ends done, not stopped, with the tokens it
        has. A finished sequence is left as it is."""
        check(lib.mk_sched_cancel(self._ptr, seq_id))

    def release(self, seq_id: int) -> None:
        """Forget a sequence (mk_sched_release): its record is freed once it is done or
        failed, and later calls naming it raise. A long-running caller releases what it has
        read, so memory does not grow with the sequences served."""
        check(lib.mk_sched_release(self._ptr, seq_id))


# -------------------------------------------------------------------- seams ----

def _seam_options(kind: str, address: str | None = None, *, connect_timeout_ms: int = 0, io_timeout_ms: int = 0,
                  psk_hex: str | None = None, psk_identity: str | None = None, cert_file: str | None = None,
                  key_file: str | None = None, ca_file: str | None = None):
    k = ffi.new("mk_seam_kind *")
    check(lib.mk_seam_kind_from_name(_cstr("seam kind", kind), k))
    o = ffi.new("mk_seam_options *", lib.mk_seam_options_default(k[0]))
    keep = []

    def cstr(field, v):
        if v is None:
            return ffi.NULL
        keep.append(ffi.new("char[]", _cstr(field, str(v))))
        return keep[-1]

    o.address = cstr("address", address)
    o.connect_timeout_ms, o.io_timeout_ms = connect_timeout_ms, io_timeout_ms
    # any TLS option asks for TLS: the C library refuses an incomplete set, never plaintext
    if any(v is not None for v in (psk_hex, psk_identity, cert_file, key_file, ca_file)):
        o.tls.enabled = True
        o.tls.psk_hex, o.tls.psk_identity = cstr("psk_hex", psk_hex), cstr("psk_identity", psk_identity)
        o.tls.cert_file, o.tls.key_file = cstr("cert_file", cert_file), cstr("key_file", key_file)
        o.tls.ca_file = cstr("ca_file", ca_file)
    return o, keep


class Seam(_Handle):
    """One end of a seam (mk_seam): ``send`` on the producing range's end, ``recv`` on the
    consuming range's end (the header is checked by the receiver's contract before the
    payload is accepted). Waits release the GIL. Kinds: "local", "wire", "unix", "tcp",
    "nccl"; TLS with psk_hex= (and psk_identity=) or cert_file=/key_file=/ca_file=."""

    def __init__(self, _ptr, rng: Range, *parents):
        self.range = rng
        # parents: the options' strings and the listener an end came from, kept until it is freed
        self._ptr = _owned(_ptr, lib.mk_seam_free, rng._ptr, *parents)
        # the boundaries sent and not yet received: a local seam hands the receiver the
        # sender's boundary itself, so it must live until then (shared by a pair's two ends)
        self._posted: list = []

    @classmethod
    def pair(cls, sender: Range, receiver: Range, kind: str = "unix", address: str | None = None,
             **options) -> "tuple[Seam, Seam]":
        o, _keep = _seam_options(kind, address, **options)
        s, r = ffi.new("mk_seam **"), ffi.new("mk_seam **")
        check(lib.mk_seam_pair(o, sender._ptr, receiver._ptr, s, r))
        tx, rx = cls(s[0], sender, o, _keep), cls(r[0], receiver, o, _keep)
        rx._posted = tx._posted
        return tx, rx

    @classmethod
    def connect(cls, sender: Range, kind: str, address: str, **options) -> "Seam":
        o, _keep = _seam_options(kind, address, **options)
        out = ffi.new("mk_seam **")
        check(lib.mk_seam_connect(o, sender._ptr, out))
        return cls(out[0], sender, o, _keep)

    def close(self) -> None:
        self._ptr = None

    def send(self, boundary: Boundary) -> None:
        check(lib.mk_seam_send(self._ptr, boundary._ptr))
        self._posted[:] = [boundary._ptr]  # what the seam now holds (a refused send changes nothing)

    def send_wait(self) -> None:
        check(lib.mk_seam_send_wait(self._ptr))

    def recv(self, seq: Sequence, into: Boundary) -> None:
        check(lib.mk_seam_recv(self._ptr, seq._ptr, into._ptr))
        self._posted.clear()  # received: the sender's boundaries are no longer read

    def send_batch(self, boundaries: "list[Boundary]") -> None:
        """Several sequences' boundaries (each named with Boundary.set_request) as one
        message (mk_seam_send_batch: TensorBundle schema 2)."""
        arr = ffi.new("mk_boundary *[]", [b._ptr for b in boundaries])
        check(lib.mk_seam_send_batch(self._ptr, ffi.cast("const mk_boundary *const *", arr), len(boundaries)))
        self._posted[:] = [b._ptr for b in boundaries]

    def recv_batch(self, sequences: "dict[str, Sequence]", into: "list[Boundary]") -> "list[str]":
        """The next message, one boundary or a batch, entry k into into[k] for the sequence
        its request id names in `sequences` (mk_seam_recv_batch). Returns each entry's status
        name ("MK_OK" where it arrived); an entry refused fails alone, its boundary left empty.
        A message that is bad as a whole raises."""
        by_id = {k.encode(): v._ptr for k, v in sequences.items()}

        @ffi.callback("const mk_sequence *(void *, const mk_boundary_header *)")
        def route(_user, h):
            return by_id.get(ffi.string(h.request_id), ffi.NULL)

        arr = ffi.new("mk_boundary *[]", [b._ptr for b in into])
        n, status = ffi.new("size_t *"), ffi.new("mk_status[]", max(len(into), 1))
        check(lib.mk_seam_recv_batch(self._ptr, route, ffi.NULL, arr, len(into), n, status))
        self._posted.clear()
        return [string(lib.mk_status_name(status[k])) for k in range(n[0])]

    @property
    def bytes(self) -> int:
        return int(lib.mk_seam_bytes(self._ptr))

    @property
    def seconds(self) -> float:
        return float(lib.mk_seam_seconds(self._ptr))


class SeamListener(_Handle):
    """A listening seam (mk_seam_listen): bound on creation; ``accept`` one sender."""

    def __init__(self, kind: str = "tcp", address: str | None = "127.0.0.1:0", **options):
        # the listener may read its options' strings (TLS key, address) until it is freed
        self._options, self._keep = _seam_options(kind, address, **options)
        out = ffi.new("mk_seam_listener **")
        check(lib.mk_seam_listen(self._options, out))
        self._ptr = ffi.gc(out[0], lib.mk_seam_listener_free)

    @property
    def address(self) -> str:
        return string(lib.mk_seam_listener_address(self._ptr))

    def accept(self, receiver: Range) -> Seam:
        out = ffi.new("mk_seam **")
        check(lib.mk_seam_accept(self._ptr, receiver._ptr, out))
        return Seam(out[0], receiver, self._ptr, self._options, self._keep)

    def close(self) -> None:
        self._ptr = None


# ------------------------------------------------------------------- stages ----

class Stage(_Handle):
    """One rank of the process-per-range runtime (mk_stage): rank r of ``world`` owns
    range r of the cuts (or of balanced cuts when cuts is None). Rank 0 listens at
    ``rendezvous`` ("HOST:PORT"), the others connect; :meth:`serve` runs the requests
    (rank 0 passes the prompts, the others none). Joining and serving release the GIL."""

    def __init__(self, model: Model, rank: int, world: int, rendezvous: str, cuts: Seq[int] | None = None, *,
                 seam: str = "tcp", timeout_ms: int = 0, max_sequences: int = 8, max_new_tokens: int = 16,
                 stop_ids: Seq[int] = (), **options):
        self.model = model
        o = ffi.new("mk_stage_options *", lib.mk_stage_options_default())
        ro, keep = _range_options(**options)
        o.range = ro[0]
        keep.append(ffi.new("char[]", _cstr("rendezvous", rendezvous)))
        o.rendezvous = keep[-1]
        if cuts is None:
            o.split_auto = True
        else:
            keep.append(ffi.new("int64_t[]", [int(c) for c in cuts] or [0]))
            o.cuts, o.n_cuts = keep[-1], len(cuts)
        stop, n_stop, stop_keep = _ids(list(stop_ids))
        keep.append(stop_keep)
        o.stop_ids, o.n_stop = stop, n_stop
        o.rank, o.world = rank, world
        o.seam = _seam_kind(seam)
        o.timeout_ms, o.max_sequences, o.max_new_tokens = timeout_ms, max_sequences, max_new_tokens
        self._keep = (o, ro, keep)
        out = ffi.new("mk_stage **")
        check(lib.mk_stage_join(model._ptr, o, out))
        self._ptr = _owned(out[0], lib.mk_stage_free, model._ptr)

    @property
    def rank(self) -> int:
        return int(lib.mk_stage_rank(self._ptr))

    @property
    def range_bounds(self) -> tuple[int, int]:
        r = lib.mk_stage_range(self._ptr)
        return int(lib.mk_range_start(r)), int(lib.mk_range_end(r))

    def serve(self, prompts: Seq[Seq[int]] = ()) -> list[dict]:
        """Run until every request is done or the run fails; returns the reports
        ({request, status, error, tokens, stopped}) in the order they came. A failed run
        raises after its reports were collected (they are on the exception as .reports)."""
        arrays = [_ids(p)[2] for p in prompts]
        reqs = ffi.new("mk_stage_request[]", max(1, len(arrays)))
        for i, a in enumerate(arrays):
            reqs[i].prompt = ffi.cast("const int32_t *", ffi.from_buffer(a))
            reqs[i].n_prompt = a.size
        reports: list[dict] = []

        @ffi.callback("void(void *, const mk_stage_report *)")
        def on_report(_user, r):
            reports.append({"request": int(r.request), "status": string(lib.mk_status_name(r.status)),
                            "error": string(r.error), "tokens": [int(t) for t in r.tokens[0:r.n_tokens]],
                            "stopped": bool(r.stopped)})

        status = lib.mk_stage_serve(self._ptr, reqs, len(arrays), on_report, ffi.NULL)
        if status:
            from .errors import error_for
            e = error_for(status)
            e.reports = reports
            raise e
        return reports

    def close(self) -> None:
        self._ptr = None
