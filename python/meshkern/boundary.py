"""The mesh node's boundary adapter API, over meshkern's C contract and bundle code.

Same names and behaviour as the reference ``meshnet_node.boundary_adapter``:
certification, roles and the sampling contract are the C library's
(``mk_certified_architecture``, ``mk_role_for_range``, ``mk_sampling_contract_from_name``);
a :class:`BoundaryBundle` is a C ``mk_bundle`` whose wire form is ``mk_bundle_pack`` /
``mk_bundle_unpack`` (all wire validation is the C library's).

:class:`BoundaryAdapter` drives either

* a :class:`meshkern.Shard` (a meshkern range): every input-side check, the layers, the
  final norm, lm_head and sampling run in C (``mk_range_forward``); or
* any object with the reference's ``ShardComputation`` duck type (``start_layer``,
  ``end_layer``, ``total_layers``, ``architecture_adapter``, ``embed_tokens``,
  ``run_layers(hidden, positions=...)``, ``final_norm``, ``lm_head``). The header has no
  range-less form of ``mk_range_check_boundary``, so for such a shard the adapter applies
  the same checks, in the same order and with the same statuses and messages, before it
  calls the shard (see :func:`_check_boundary_header`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import core
from ._lib import DEFINES, ffi, lib, string
from .errors import (ArchitectureError, BoundaryContractError, MeshkernError, UncertifiedArchitectureError,
                     check, raise_status)

__all__ = ["BOUNDARY_SCHEMA_VERSION", "BoundaryAdapter", "BoundaryBundle", "BoundaryContractError",
           "SamplingContract", "ShardRole", "TailOutput", "UncertifiedArchitectureError", "certified_architecture",
           "is_certified_architecture", "role_for_range", "ArchitectureBoundary", "MeshkernError"]

BOUNDARY_SCHEMA_VERSION: int = DEFINES["MK_BOUNDARY_SCHEMA_VERSION"]
BOUNDARY_POINT = "dense.residual.v1"

ShardRole = core.Role


@dataclass(frozen=True)
class ArchitectureBoundary:
    adapter: str
    boundary_tensor_name: str


def _cname(name: Any):
    return name.encode() if isinstance(name, str) else ffi.NULL


def _nul_name(name: Any) -> bool:
    """A str name with a NUL character: C would read it only up to the NUL ("dense-llama\0x"
    as "dense-llama"), so it is no name of the table (as for the reference: uncertified)."""
    return isinstance(name, str) and "\0" in name


def certified_architecture(name: Any) -> ArchitectureBoundary:
    """Resolve a name or alias to the certified adapter; fails closed
    (UncertifiedArchitectureError) for anything else, including "" and None."""
    if _nul_name(name):
        raise_status("MK_ERR_UNCERTIFIED_ARCHITECTURE", f"architecture {name!r} contains a NUL character: "
                                                        "not a certified architecture")
    out = ffi.new("mk_architecture *")
    check(lib.mk_certified_architecture(_cname(name), out))
    return ArchitectureBoundary(string(out.adapter), string(out.boundary_tensor_name))


def is_certified_architecture(name: Any) -> bool:
    return not _nul_name(name) and bool(lib.mk_is_certified_architecture(_cname(name)))


def role_for_range(start: int, end: int, total: int) -> ShardRole:
    out = ffi.new("mk_role *")
    check(lib.mk_role_for_range(int(start), int(end), int(total), out))
    return ShardRole(int(out[0]))


class SamplingContract:
    """An explicit sampling contract; only "greedy" is certified (others raise
    UncertifiedSamplingError, a BoundaryContractError)."""

    def __init__(self, mode: str = "greedy"):
        if _nul_name(str(mode)):
            raise_status("MK_ERR_UNCERTIFIED_SAMPLING", f"sampling mode {str(mode)!r} contains a NUL character: "
                                                        "not a certified mode")
        c = ffi.new("mk_sampling_contract *")
        check(lib.mk_sampling_contract_from_name(c, str(mode).encode()))
        self._mode = int(c.mode)

    @property
    def mode(self) -> str:
        return string(lib.mk_sampling_mode_name(self._mode))

    def __repr__(self) -> str:
        return f"SamplingContract(mode={self.mode!r})"


class TailOutput:
    """A tail range's output: logits [batch, vocab] (last row only), the sampled token and
    the sampling contract it went through."""

    def __init__(self, logits: np.ndarray | None, token_id: int, sampling: SamplingContract | None = None,
                 *, _core: core.TailOutput | None = None):
        self.logits = logits
        self.token_id = int(token_id)
        self.sampling = sampling or SamplingContract("greedy")
        self._core = _core

    def tail_result(self, *, request_id: str, runtime_recipe_digest: str, chat_template_id: str = "",
                    chat_template_version: str = "", reasoning_mode: str = "", logits: bool = False,
                    sampling: dict | None = None) -> bytes:
        """This output as protocol TailResult bytes (mk_tail_result_pack_token / _logits)."""
        ident = dict(request_id=request_id, runtime_recipe_digest=runtime_recipe_digest,
                     chat_template_id=chat_template_id, chat_template_version=chat_template_version,
                     reasoning_mode=reasoning_mode)
        if logits:
            return core.tail_result_pack_logits(self.logits, identity=ident, sampling=sampling)
        return core.tail_result_pack_token(self.token_id, identity=ident, sampling=sampling)


class BoundaryBundle:
    """The residual boundary (a C ``mk_bundle``): residual [batch, seq, hidden] float32,
    positions [batch, seq], next_layer, schema version, adapter, normalized flag, recipe
    digest. ``residual``/``positions`` are zero-copy views of the C arrays."""

    def __init__(self, *, residual, positions=None, next_layer: int, architecture_adapter: str = "dense-llama",
                 schema_version: int = BOUNDARY_SCHEMA_VERSION, tensor_name: str = "residual_stream",
                 normalized: bool = False, recipe_digest: str = "", request_id: str = "",
                 boundary_point: str = BOUNDARY_POINT, step: int = 0, _bundle: core.Bundle | None = None):
        if _bundle is not None:
            self._b = _bundle
            return
        r = np.asarray(residual, dtype=np.float32)
        if r.ndim == 2:
            r = r[None]
        if r.ndim != 3:
            raise_status("MK_ERR_SHAPE", f"residual must be [batch, seq, hidden], got shape {r.shape}")
        b = core.Bundle.create(*r.shape)
        b.residual[...] = r
        if positions is None:
            positions = np.broadcast_to(np.arange(r.shape[1], dtype=np.int32), r.shape[:2])
        b.positions[...] = np.asarray(positions).reshape(r.shape[:2])
        b.set_header(adapter=str(architecture_adapter), schema_version=int(schema_version),
                     tensor_name=str(tensor_name), next_layer=int(next_layer), normalized=bool(normalized),
                     recipe_digest=recipe_digest, request_id=request_id, boundary_point=boundary_point,
                     step=int(step), position=int(b.positions[0, 0]) if r.shape[1] else 0)
        self._b = b

    # -- the wire
    def pack(self) -> bytes:
        return self._b.to_bytes()

    @classmethod
    def unpack(cls, data: bytes) -> "BoundaryBundle":
        """Validate and decode bytes (never trusting a length, shape or count from the
        wire); malformed bytes raise a WireError (a BoundaryContractError)."""
        return cls(residual=None, next_layer=0, _bundle=core.Bundle.from_bytes(bytes(data)))

    def named_tensor_fields(self) -> dict:
        return self._b.tensor_fields()

    # -- fields
    @property
    def bundle(self) -> core.Bundle:
        return self._b

    @property
    def header(self) -> core.BoundaryHeader:
        return self._b.header

    @property
    def residual(self) -> np.ndarray:
        return self._b.residual

    @property
    def positions(self) -> np.ndarray:
        return self._b.positions

    @property
    def next_layer(self) -> int:
        return self.header.next_layer

    @property
    def architecture_adapter(self) -> str:
        return self.header.adapter

    @property
    def schema_version(self) -> int:
        return self.header.schema_version

    @property
    def tensor_name(self) -> str:
        return self.header.tensor_name

    @property
    def normalized(self) -> bool:
        return self.header.normalized

    @property
    def recipe_digest(self) -> str:
        return self.header.recipe_digest


def _duck_recipe_digest(shard, canonical: str) -> str:
    """A recipe digest for a duck-typed shard: its own ``recipe_digest`` when it has one,
    else sha256 of (adapter, total layers, the model object's identity class)."""
    d = getattr(shard, "recipe_digest", None)
    if d:
        return str(d)
    model = getattr(shard, "_model", None)
    tag = f"{canonical}:{shard.total_layers}:{type(model).__qualname__ if model is not None else type(shard).__qualname__}"
    return hashlib.sha256(tag.encode()).hexdigest()


def _check_boundary_header(role: ShardRole, start: int, digest: str, h: core.BoundaryHeader,
                           hidden: int | None) -> None:
    """mk_range_check_boundary's checks, for a duck-typed shard (the C function needs an
    mk_range). Same order, statuses and messages as host/range/range.c."""
    if h.normalized:
        raise_status("MK_ERR_NORMALIZED_BUNDLE",
                     "boundary bundle is marked normalized: the seam carries the UNNORMALIZED residual stream")
    if h.schema_version != BOUNDARY_SCHEMA_VERSION:
        raise_status("MK_ERR_SCHEMA_VERSION", f"bundle schema version {h.schema_version} is not the supported "
                                              f"version {BOUNDARY_SCHEMA_VERSION}")
    if h.architecture != "dense":
        raise_status("MK_ERR_ARCHITECTURE_MISMATCH", f"bundle architecture type {h.architecture} is not dense: "
                                                     "it is not executable by the dense-llama adapter")
    arch = certified_architecture(h.adapter)
    if h.tensor_name != arch.boundary_tensor_name:
        raise_status("MK_ERR_TENSOR_NAME",
                     f"boundary tensor is named '{h.tensor_name}', expected '{arch.boundary_tensor_name}'")
    if h.boundary_point != BOUNDARY_POINT:
        raise_status("MK_ERR_BOUNDARY_POINT", f"incompatible dense residual boundary schema '{h.boundary_point}'")
    if h.next_layer != start:
        raise_status("MK_ERR_SEAM_MISMATCH", f"seam mismatch: this range starts at layer {start} but the bundle "
                                             f"was cut before layer {h.next_layer}")
    if h.recipe_digest != digest:
        raise_status("MK_ERR_RECIPE_DIGEST", f"bundle recipe digest {h.recipe_digest[:16]}... does not match "
                                             f"this range's {digest[:16]}...")
    if hidden is not None and h.hidden != hidden:
        raise_status("MK_ERR_HIDDEN_WIDTH", f"bundle hidden width {h.hidden} does not match the model's {hidden}")
    if h.batch != 1:
        raise_status("MK_ERR_SHAPE", f"bundle batch {h.batch}: a sequence carries batch 1")
    if h.dtype != "f32":
        raise_status("MK_ERR_DTYPE", f"bundle residual dtype {h.dtype} is not f32")
    if h.rows == 0:
        raise_status("MK_ERR_EMPTY_INPUT", "bundle carries no rows")


def _check_input_kind(role: ShardRole, has_ids: bool, n_ids: int, has_boundary: bool) -> None:
    """host/range/range.c mk_check_input_kind, for a duck-typed shard."""
    name = role.label
    if role.owns_embedding:
        if has_boundary:
            raise_status("MK_ERR_HEAD_OWNS_EMBEDDING", f"{name} range refuses a boundary bundle: head owns token "
                                                       "embedding and accepts token ids")
        if not has_ids or n_ids == 0:
            raise_status("MK_ERR_EMPTY_INPUT", f"{name} range requires at least one token id")
        return
    if has_ids:
        raise_status("MK_ERR_BYPASS_EMBEDDING",
                     f"{name} range refuses token ids: middle and tail ranges bypass token embedding")
    if not has_boundary:
        raise_status("MK_ERR_BUNDLE_REQUIRED",
                     f"{name} range must receive the named boundary bundle 'residual_stream'")


class BoundaryAdapter:
    """Executes one shard under the boundary contract: HEAD/FULL take token ids, MIDDLE/TAIL
    a :class:`BoundaryBundle`; non-tail ranges emit the raw residual of every row, tail
    ranges the last row's logits and a token sampled through the contract."""

    def __init__(self, shard, *, sampling: SamplingContract | None = None):
        from .shard import Shard

        self.shard = shard
        self.architecture = certified_architecture(getattr(shard, "architecture_adapter", None))
        self.role = role_for_range(shard.start_layer, shard.end_layer, shard.total_layers)
        self.sampling = sampling or SamplingContract("greedy")
        self._native = isinstance(shard, Shard)
        self.recipe_digest = shard.recipe_digest if self._native else \
            _duck_recipe_digest(shard, self.architecture.adapter)

    def forward(self, *, token_ids=None, boundary: BoundaryBundle | None = None) -> BoundaryBundle | TailOutput:
        if self._native:
            return self._forward_native(token_ids, boundary)
        return self._forward_duck(token_ids, boundary)

    # -- a meshkern range: the C contract end to end
    def _forward_native(self, token_ids, boundary):
        out = self.shard.forward(token_ids=token_ids, bundle=boundary.bundle if boundary is not None else None,
                                 sampling=self.sampling.mode)
        if isinstance(out, core.TailOutput):
            return TailOutput(out.logits, out.token_id, SamplingContract(out.sampling_mode), _core=out)
        return BoundaryBundle(residual=None, next_layer=0, _bundle=out)

    # -- a duck-typed computation
    def _forward_duck(self, token_ids, boundary):
        shard, role = self.shard, self.role
        ids = None if token_ids is None else np.asarray(token_ids)
        _check_input_kind(role, ids is not None, 0 if ids is None else ids.size, boundary is not None)
        if role.owns_embedding:
            core._id_array(token_ids)  # integers only (TypeError), as on the native path; the shard gets ids as given
            ids2 = ids.reshape(1, -1) if ids.ndim <= 1 else ids
            hidden = np.asarray(shard.embed_tokens(ids2), dtype=np.float32)
            positions = np.broadcast_to(np.arange(ids2.shape[-1], dtype=np.int32), ids2.shape)
        else:
            _check_boundary_header(role, shard.start_layer, self.recipe_digest, boundary.header,
                                   getattr(shard, "hidden", None))
            hidden = boundary.residual
            positions = boundary.positions
        hidden = shard.run_layers(hidden, positions=positions)
        if role.owns_final_head:
            last = np.asarray(hidden, dtype=np.float32)[:, -1, :]
            logits = np.asarray(shard.lm_head(shard.final_norm(last)), dtype=np.float32)
            logits = logits.reshape(last.shape[0], -1)
            return TailOutput(logits, int(np.argmax(logits[0])), self.sampling)
        return BoundaryBundle(residual=hidden, positions=positions, next_layer=shard.end_layer + 1,
                              architecture_adapter=self.architecture.adapter, recipe_digest=self.recipe_digest)
