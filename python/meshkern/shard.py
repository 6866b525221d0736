"""meshkern.Shard: a shard computation backed by a meshkern range."""

from __future__ import annotations

from . import core


class Shard:
    """Layers [start_layer, end_layer] of a :class:`meshkern.Model` as a meshkern range
    (any backend: pass backend="cuda", device=...; see :class:`meshkern.Range`), usable in
    place of a duck-typed shard computation: ``BoundaryAdapter(Shard(model, 0, 14))``.

    A range fuses embedding, layers, final norm, lm_head and sampling in C, so instead of
    the reference's ``embed_tokens`` / ``run_layers`` / ``final_norm`` / ``lm_head`` it offers
    :meth:`forward`, which the adapter recognises. ``stateless=True`` (the default, like the
    reference's shard) starts every forward from an empty KV cache; ``stateless=False``
    keeps the sequence, so a forward continues it (decode)."""

    def __init__(self, model: core.Model, start_layer: int, end_layer: int, *, stateless: bool = True,
                 architecture_adapter: str | None = None, **range_options):
        if architecture_adapter is not None:
            range_options["architecture"] = architecture_adapter
        self.model = model
        self._options = range_options
        self._range: core.Range | None = None
        self._sequence: core.Sequence | None = None
        self.stateless = stateless
        self.start_layer = int(start_layer)
        self.end_layer = int(end_layer)
        self.total_layers = model.n_layers
        self.architecture_adapter = architecture_adapter or model.architecture
        self.hidden = model.hparams["hidden"]

    @property
    def range(self) -> core.Range:
        """The meshkern range, built on first use (so that, as with the reference's shard,
        an uncertified architecture is refused when an adapter is built over it)."""
        if self._range is None:
            self._range = core.Range(self.model, self.start_layer, self.end_layer, **self._options)
            self._sequence = self._range.sequence()
        return self._range

    @property
    def sequence(self) -> core.Sequence:
        self.range
        return self._sequence

    @property
    def recipe_digest(self) -> str:
        return self.range.recipe_digest

    @property
    def role(self) -> core.Role:
        return self.range.role

    def reset(self) -> None:
        self.sequence.reset()

    def forward(self, token_ids=None, bundle: core.Bundle | None = None, *, sampling: str | None = None):
        """One mk_range_forward: a :class:`meshkern.Bundle` or :class:`meshkern.TailOutput`."""
        if self.stateless:
            self.sequence.reset()
        return self.range.forward(self.sequence, token_ids, bundle, sampling=sampling)
