"""The config fields that size a zoo module, checked before anything is built from a checkpoint.

transformers builds whatever a config asks for: 0 heads divide by zero, a size of -1 fails
inside torch, a million layers fill memory before anything looks at the weights. A
checkpoint's config is refused here instead, naming the key: each field of the family's
`sizes` an int (or a list of ints, one per stage) in its range, heads dividing their width,
and nothing larger than the checkpoint's tensors could hold.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from pipeline.models.spec import CheckpointError, ModelFamily


def check_sizes(config: PretrainedConfig, family: ModelFamily, where: str, tensors: int, elements: int) -> None:
    """Refuse (CheckpointError, `where` first) a config whose sizes are not usable for a
    checkpoint that holds `tensors` tensors of `elements` values in all.

    The bounds are loose but sure: every size of a real module is at most its number of
    weights, and every repeated block (layer, stage) has at least one tensor of its own.
    They keep the module that is then built on the meta device (to count exactly) small.
    """
    values = {size.key: _value(config, size.key) for size in family.sizes}
    for size in family.sizes:
        value = values[size.key]
        if isinstance(value, (list, tuple)) and not value:
            raise CheckpointError(f"{where}: {size.key} is an empty list")
        for i, entry in enumerate(_entries(value)):
            name = f"{size.key}[{i}]" if isinstance(value, (list, tuple)) else size.key
            # bool is an int to Python, not to a config.
            if type(entry) is not int:
                raise CheckpointError(f"{where}: {name} is {entry!r}, not an int")
            if entry < size.minimum:
                raise CheckpointError(f"{where}: {name} is {entry}; it must be at least {size.minimum}")
            if entry > elements:
                raise CheckpointError(f"{where}: {name} is {entry}, more than the {elements} weights "
                                      "the checkpoint holds in all")
    # A repeated block's count is at least 1 per stage, so this bounds the stages too.
    stages = {key: len(v) for key, v in values.items() if isinstance(v, (list, tuple))}
    if stages:
        first, count = next(iter(stages.items()))
        for key, n in stages.items():
            if n != count:
                raise CheckpointError(f"{where}: {key} has {n} entries, {first} has {count}: one per stage in both")
    for size in family.sizes:
        if size.repeats:
            blocks = sum(_entries(values[size.key]))
            if blocks > tensors:
                raise CheckpointError(f"{where}: {size.key} is {values[size.key]}: {blocks} repeated blocks, "
                                      f"more than the {tensors} tensors the checkpoint holds")
        if size.below is not None:
            limit = values[size.below] if isinstance(size.below, str) else size.below
            _check_pairs(where, size.key, values[size.key], size.below, limit, lambda a, b: a < b, "less than")
    for heads, width in family.divides:
        _check_pairs(where, heads, values[heads], width, values[width],
                     lambda a, b: b % a == 0, "a divisor of")


def describe(config: PretrainedConfig, family: ModelFamily) -> str:
    """The config's sizes as `key=value` pairs, for messages."""
    return ", ".join(f"{size.key}={_value(config, size.key)}" for size in family.sizes)


def _value(config: PretrainedConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part, None)
    return value


def _entries(value: int | list[int] | tuple[int, ...]) -> list[int]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_pairs(where: str, key: str, value, other_key: str | int, other, holds, relation: str) -> None:
    """`holds(a, b)` for each entry of `value` and its counterpart in `other` (a list of the same
    length, or one number for all); `other_key` names `other`, or is that number."""
    ours, theirs = _entries(value), _entries(other)
    if len(theirs) == 1:
        theirs = theirs * len(ours)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if not holds(a, b):
            name = f"{key}[{i}]" if isinstance(value, (list, tuple)) else key
            if isinstance(other_key, int):
                counterpart = str(other_key)
            else:
                counterpart = (f"{other_key}[{i}]" if isinstance(other, (list, tuple)) else other_key) + f" ({b})"
            raise CheckpointError(f"{where}: {name} is {a}; it must be {relation} {counterpart}")
