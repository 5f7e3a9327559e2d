"""The read-back check of every write: the tensors a format will write, read back through the same format
in memory (``Format.decode``), must be the canonical state bit for bit.

Each canonical tensor is compared with what the decoder makes of the file's tensors, one at a time and
part by part (the rows each file tensor fills: a join of q, k and v is three comparisons), without loading
anything where the two are known to be the same (``formats.tensors.identical``). A format whose writer
loads each of its tensors exactly once inside its atomic write (``Format.checks_on_write``: the .npz
layouts) has the parts read from a computed file tensor (a transposed kernel) compared when the writer
computes it, on that buffer, before its bytes are written: each tensor is computed once, and the bytes
written are the bytes compared. Anything that differs raises before the destination is put in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from vit_common.checkpoints.formats.protocol import Encoded, Format
from vit_common.checkpoints.formats.provenance import ASSUMED, WRITTEN, flag_for
from vit_common.checkpoints.formats.rules import PieceTensor
from vit_common.checkpoints.formats.tensors import (
    LazyTensor,
    RowConcat,
    Tensor,
    dtype_of,
    identical,
    row_slice,
    same_bits,
)


class _Slot(LazyTensor):
    """A computed file tensor as the decoder sees it: the writer's buffer of it while the parts read from it
    are compared (``CheckedTensor``), else computed afresh from ``tensor``."""

    __slots__ = ("buffer", "tensor")

    def __init__(self, tensor: LazyTensor):
        super().__init__(tensor.shape, tensor.dtype, self._value)
        self.tensor, self.buffer = tensor, None

    def _value(self) -> np.ndarray:
        return self.buffer if self.buffer is not None else np.asarray(self.tensor)


class CheckedTensor(LazyTensor):
    """A file tensor that, when loaded, is computed once and its ``checks`` run on that buffer (each a
    canonical name, its rows in the state being written and the decoder's tensor of those rows, read
    through ``slot``) before it is returned to the writer of format ``fmt``.

    Raises (on load):
        AssertionError: naming the canonical tensors whose rows do not read back bit-exact.
    """

    __slots__ = ("checks", "fmt", "ran", "slot")

    def __init__(self, slot: _Slot, fmt: str):
        super().__init__(slot.shape, slot.dtype, self._checked)
        self.slot, self.fmt, self.checks, self.ran = slot, fmt, [], False

    def _checked(self) -> np.ndarray:
        self.slot.buffer = np.asarray(self.slot.tensor)
        try:
            bad = sorted({name for name, rows, back in self.checks if not same_bits(rows, back)})
            buffer = self.slot.buffer
        finally:
            self.slot.buffer = None
        if bad:
            raise AssertionError(f"{self.fmt} writer does not read back bit-exact: {bad}")
        self.ran = True
        return buffer


def _parts(t: Tensor) -> list[Tensor]:
    return list(t.parts) if isinstance(t, RowConcat) else [t]


def read_back(f: Format, enc: Encoded, assumed: Sequence[str]) -> list[str]:
    """Decode ``enc`` in memory and compare every tensor with ``enc.state`` (with ``f.checks_on_write``,
    those read from a computed file tensor when the writer loads it: ``enc.tensors`` then holds
    ``CheckedTensor``s, and ``confirm_checked`` says after the write that each ran); raise if any differs;
    return what the format loses (a field it does not record, or the fact that a field was assumed).

    Raises:
        AssertionError: tensors that do not read back bit-exact, or missing from the decoded state.
    """
    slots = {}
    if f.checks_on_write:
        slots = {k: _Slot(v) for k, v in enc.tensors.items() if isinstance(v, LazyTensor)}
    dec = f.decode(dataclasses.replace(enc, tensors={**enc.tensors, **slots}) if slots else enc)
    checked = {k: CheckedTensor(s, f.name) for k, s in slots.items()}
    state, bad = enc.state, []
    for k, v in state.items():
        back = dec.state.get(k)
        if back is None or np.shape(back) != np.shape(v) or dtype_of(back) != dtype_of(v):
            bad.append(k)
            continue
        if identical(v, back):
            continue
        parts = _parts(back)
        bounds = np.cumsum([0] + [np.shape(p)[0] for p in parts]) if len(parts) > 1 else None
        for i, part in enumerate(parts):
            rows = v if bounds is None else row_slice(v, int(bounds[i]), int(bounds[i + 1]))
            key = part.key if isinstance(part, PieceTensor) else None
            if key in checked:
                checked[key].checks.append((k, rows, part))
            elif not same_bits(rows, part):
                bad.append(k)
    if bad or set(dec.state) != set(state):
        raise AssertionError(f"{f.name} writer does not read back bit-exact: {bad or set(dec.state) ^ set(state)}")
    if checked:
        enc.tensors = {**enc.tensors, **checked}
    return _lost(f, enc, dec, assumed)


def confirm_checked(enc: Encoded) -> None:
    """Raise if a ``CheckedTensor`` of ``enc.tensors`` was never loaded: its comparisons did not run.

    Raises:
        AssertionError: naming those tensors (a writer that skipped them: a format bug).
    """
    skipped = [k for k, v in enc.tensors.items() if isinstance(v, CheckedTensor) and not v.ran]
    if skipped:
        raise AssertionError(f"the writer never loaded {skipped}: their read-back check did not run")


def _lost(f: Format, enc: Encoded, dec, assumed: Sequence[str]) -> list[str]:
    lost = []
    inert = enc.cfg.inert_fields()
    for name in (k for k in dec.provenance if k not in inert):
        value, back = getattr(enc.cfg, name), getattr(dec.cfg, name)
        if dec.provenance[name] == WRITTEN:
            lost.append(
                f"{f.name} files cannot hold {name}={value!r} (no rule reads it back); pass "
                f"{flag_for(name, value)} when reading the file"
            )
        elif back != value:
            lost.append(
                f"{f.name} files cannot hold {name}={value!r} (it reads back as {back!r}); pass "
                f"{flag_for(name, value)} when reading the file"
            )
    hardened = {}
    for name in assumed:
        origin = dec.provenance.get(name)
        if (
            origin not in (None, WRITTEN)
            and origin.kind != ASSUMED
            and getattr(enc.cfg, name) == getattr(dec.cfg, name)
        ):
            hardened.setdefault(origin.kind, []).append(name)
    lost += [
        f"{f.name} files cannot record that {', '.join(names)} {'was' if len(names) == 1 else 'were'} assumed "
        f"(the source did not state {'it' if len(names) == 1 else 'them'}): readers of this file will take "
        f"{'it' if len(names) == 1 else 'them'} as {kind}"
        for kind, names in hardened.items()
    ]
    return lost
