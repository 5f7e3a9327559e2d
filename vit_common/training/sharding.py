"""The 2-D device mesh of a training run and the rules that shard its parameters, as text, framework-free.

The mesh has two axes (big_vision's multi-slice mesh, ``big_vision/sharding.py``): ``replica``, over
which parameters and optimizer state are copied and gradients summed, and ``fsdp``, over which they
are split (ZeRO-3 style); the batch is split over both. A mesh spec is ``"replica=R,fsdp=F"``
(``parse_mesh``): an axis left out has size 1, one size may be -1 for all devices the other leaves
(``mesh_sizes``), so ``--sharding dp`` is ``replica=-1,fsdp=1`` and ``--sharding fsdp``
``replica=1,fsdp=-1`` (``SHORT_FORMS``).

Sharding rules (``parse_rules``) are ``"REGEX=AXES;REGEX=AXES;..."``, tried in order against each
parameter's name (the JAX twin's state path joined by dots, ``blocks.0.attn.qkv.kernel``; the regex
must match the whole name, ``re.fullmatch``); the first that matches decides (big_vision's
``sharding_strategy`` list). AXES is one mesh axis per dimension, comma-separated, ``.`` for a
dimension kept whole and ``replica+fsdp`` for one split over both (``.,fsdp`` for a kernel [in, out]
split along its outputs), or ``largest`` (the largest dimension that the ``fsdp`` size divides, split
along ``fsdp``; kept whole when none does: big_vision's ``fsdp`` strategy) or ``replicated``. A
parameter no rule matches is replicated. The default table is ``DEFAULT_RULES``, one rule: every
parameter ``largest``. An optimizer-state leaf of a parameter's shape (Adam's moments) and the EMA
take that parameter's sharding.

Errors are ValueErrors of one line naming the value and what was expected.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

MESH_AXES = ("replica", "fsdp")  # the mesh's axes, outer to inner (replica spans processes first)
SHORT_FORMS = {"dp": "replica=-1,fsdp=1", "fsdp": "replica=1,fsdp=-1"}  # --sharding's mesh specs
DEFAULT_RULES = ".*=largest"
WHOLE = ("largest", "replicated")  # the AXES of a rule that names no dimension


def parse_mesh(text: str) -> dict[str, int]:
    """``"replica=R,fsdp=F"`` -> {"replica": R, "fsdp": F}; an axis not named has size 1, a size is an
    int >= 1 or -1 (at most one: all devices the other leaves, ``mesh_sizes``).

    Raises:
        ValueError: an unknown or repeated axis name, a size that is not an int >= 1 or -1, two -1.
    """
    sizes = dict.fromkeys(MESH_AXES, 1)
    seen = []
    for item in text.split(","):
        name, sep, size = (s.strip() for s in item.partition("="))
        if name not in MESH_AXES or not sep:
            raise ValueError(
                f"mesh={text!r}: expected replica=R,fsdp=F (axes {' and '.join(MESH_AXES)}), not {item.strip()!r}"
            )
        if name in seen:
            raise ValueError(f"mesh={text!r}: expected each axis once, {name!r} is named twice")
        if not re.fullmatch(r"-1|[1-9][0-9]*", size):
            raise ValueError(f"mesh={text!r}: expected {name}'s size to be an int >= 1 or -1, not {size!r}")
        seen.append(name)
        sizes[name] = int(size)
    if list(sizes.values()).count(-1) > 1:
        raise ValueError(f"mesh={text!r}: expected at most one size -1 (all devices the others leave)")
    return sizes


def mesh_sizes(text: str, device_count: int) -> dict[str, int]:
    """``parse_mesh(text)`` with its -1 resolved for ``device_count`` devices.

    Raises:
        ValueError: as ``parse_mesh``; sizes whose product is not ``device_count`` (or does not divide
            it, with a -1), naming both.
    """
    sizes = parse_mesh(text)
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if device_count % fixed:
            raise ValueError(
                f"mesh={text!r}: expected sizes that divide the device count, {device_count} (jax.device_count(), "
                f"every process's devices), not {fixed}"
            )
        return {k: device_count // fixed if s == -1 else s for k, s in sizes.items()}
    if fixed != device_count:
        raise ValueError(
            f"mesh={text!r}: expected sizes whose product is the device count, {device_count} "
            f"(jax.device_count(), every process's devices), not {fixed}"
        )
    return sizes


@dataclass(frozen=True)
class Rule:
    """One sharding rule: ``pattern`` (a regex matching whole parameter names) and ``axes``: a tuple of
    one entry per dimension (None: whole; a tuple of mesh axis names: split over them), or one of
    ``WHOLE`` as a string."""

    pattern: str
    axes: tuple[tuple[str, ...] | None, ...] | str

    def __str__(self) -> str:
        if isinstance(self.axes, str):
            return f"{self.pattern}={self.axes}"
        return f"{self.pattern}={','.join('+'.join(a) if a else '.' for a in self.axes)}"


def parse_rules(text: str) -> tuple[Rule, ...]:
    """``"REGEX=AXES;..."`` (module docstring) -> its rules, in order. The regex is what comes before
    the last ``=`` of a rule (it may hold ``=``, not ``;``).

    Raises:
        ValueError: no rule, a rule without ``=``, a regex that does not compile, an AXES entry that is no
            mesh axis (``MESH_AXES``), ``.`` or one of ``WHOLE``.
    """
    rules = []
    for item in (s.strip() for s in text.split(";")):
        pattern, sep, axes = item.rpartition("=")
        if not sep or not pattern or not item:
            raise ValueError(f"shard_rules={text!r}: expected REGEX=AXES rules separated by ';', not {item!r}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"shard_rules={text!r}: {pattern!r} is no regular expression ({e})") from None
        axes = axes.strip()
        if axes in WHOLE:
            rules.append(Rule(pattern, axes))
            continue
        dims = []
        for entry in axes.split(","):
            names = tuple(n.strip() for n in entry.split("+"))
            if entry.strip() == ".":
                dims.append(None)
            elif all(n in MESH_AXES for n in names) and len(set(names)) == len(names):
                dims.append(names)
            else:
                raise ValueError(
                    f"shard_rules={text!r}: rule {item!r}: expected per dimension '.', a mesh axis "
                    f"({', '.join(MESH_AXES)}) or axes joined by '+', or the whole rule {' or '.join(WHOLE)}; "
                    f"not {entry.strip()!r}"
                )
        rules.append(Rule(pattern, tuple(dims)))
    return tuple(rules)


def largest_spec(shape: tuple[int, ...], n: int, axis: str = "fsdp") -> tuple:
    """The spec of ``largest``: ``axis`` on the largest dimension of ``shape`` that ``n`` (its size)
    divides (of equal ones the last), () when none does or ``n`` is 1."""
    dims = [i for i in np.argsort(shape, kind="stable")[::-1] if shape[i] % n == 0 and shape[i] >= n]
    if n == 1 or not dims:
        return ()
    spec = [None] * len(shape)
    spec[int(dims[0])] = axis
    return tuple(spec)


def partition(rules: tuple[Rule, ...], shapes: dict[str, tuple[int, ...]], sizes: dict[str, int]) -> dict[str, tuple]:
    """{parameter name: its PartitionSpec entries} (a tuple: None, an axis name or a tuple of them per
    dimension; () replicated) of ``rules`` for parameters of ``shapes`` on a mesh of ``sizes``
    ({axis: size}).

    Raises:
        ValueError: a rule that decides no parameter (its regex matches none, or only parameters an
            earlier rule took), a rule of another rank than a parameter it matches, or one that splits a
            dimension its axes' size does not divide; naming the rule, the parameter and the sizes.
    """
    out, used = {}, set()
    for name, shape in shapes.items():
        i = next((i for i, r in enumerate(rules) if re.fullmatch(r.pattern, name)), None)
        if i is None:
            out[name] = ()
            continue
        used.add(i)
        rule = rules[i]
        if rule.axes == "replicated":
            out[name] = ()
        elif rule.axes == "largest":
            out[name] = largest_spec(tuple(shape), sizes["fsdp"])
        else:
            out[name] = _checked(rule, name, tuple(shape), sizes)
    unused = [str(r) for i, r in enumerate(rules) if i not in used]
    if unused:
        some = ", ".join(list(shapes)[:3])
        raise ValueError(
            f"shard_rules: '{unused[0]}' decides no parameter (its regex matches none in full, or only ones an "
            f"earlier rule took); expected a regex over names such as {some}"
        )
    return out


def _checked(rule: Rule, name: str, shape: tuple[int, ...], sizes: dict[str, int]) -> tuple:
    """A per-dimension rule's spec for parameter ``name`` of ``shape``, checked against it."""
    if len(rule.axes) != len(shape):
        raise ValueError(
            f"shard_rules: '{rule}' gives {len(rule.axes)} dimension(s), {name} has {len(shape)} {list(shape)}"
        )
    spec = []
    for dim, (axes, size) in enumerate(zip(rule.axes, shape, strict=True)):
        n = math.prod(sizes[a] for a in axes or ())
        if size % n:
            raise ValueError(
                f"shard_rules: '{rule}' splits dimension {dim} of {name} {list(shape)} over "
                f"{'+'.join(axes)} ({n} devices), which does not divide {size}"
            )
        spec.append(axes[0] if axes and len(axes) == 1 else axes)
    return tuple(spec)
