"""The operator table: each `KernelCall` operator of a program -> a Python kernel.

A kernel is `kernel(values, ids)`: `ids` are the instruction's value indices (every schema
argument in schema order, then the returns), `values` the plan's live values. Out-variant
kernels write into their planned out tensors in place; ExecuTorch's primitive ops
(`executorch_prim::*`) compute SymInt values. Most operators map to the `torch.ops`
overload of the same name; a few copy-shaped ones take a faster path (a view and one
`copy_` instead of a strided out kernel).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

Kernel = Callable[[list, list], None]

# ExecuTorch's ScalarType codes (exir/scalar_type.py) for the dtypes tensors and dtype
# arguments may carry.
DTYPES = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
    6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}
_MEMORY_FORMATS = {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last}

_PRIM_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "truediv": operator.truediv, "mod": operator.mod, "eq": operator.eq, "gt": operator.gt,
    "lt": operator.lt, "ge": operator.ge, "le": operator.le,
}


def resized(out: torch.Tensor, shape) -> torch.Tensor:
    """`out` with `shape`, in place: dynamic tensors shrink or grow within their planned slot."""
    if out.shape != shape:
        out.resize_(shape)
    return out


def _permute_copy(values, ids):
    x, dims, out = values[ids[0]], values[ids[1]], values[ids[2]]
    view = x.permute(dims)
    resized(out, view.shape).copy_(view)


def _expand_copy(values, ids):
    x, size, out = values[ids[0]], values[ids[1]], values[ids[3]]
    view = x.expand(size)
    resized(out, view.shape).copy_(view)


def _view_copy(values, ids):
    x, size, out = values[ids[0]], values[ids[1]], values[ids[2]]
    view = x.reshape(size)
    resized(out, view.shape).copy_(view)


def _dim_order_copy(values, ids):
    # _clone_dim_order / _to_dim_order_copy (self, *, [dtype,] non_blocking, dim_order, out):
    # the planned out tensor already has the dtype and dim order; copy_ converts.
    x, out = values[ids[0]], values[ids[-2]]
    resized(out, x.shape).copy_(x)


def _sym_size(values, ids):
    values[ids[2]] = values[ids[0]].size(values[ids[1]])


def _sym_numel(values, ids):
    values[ids[1]] = values[ids[0]].numel()


def _et_view(values, ids):
    # The out value is a view of self, not planned memory of its own.
    values[ids[2]] = values[ids[0]].view(values[ids[1]])


def _prim_binary(fn) -> Kernel:
    def kernel(values, ids):
        values[ids[2]] = fn(values[ids[0]], values[ids[1]])

    return kernel


def _prim_neg(values, ids):
    values[ids[1]] = -values[ids[0]]


_SPECIAL: dict[str, Kernel] = {
    "aten::permute_copy.out": _permute_copy,
    "aten::expand_copy.out": _expand_copy,
    "aten::view_copy.out": _view_copy,
    "dim_order_ops::_clone_dim_order.out": _dim_order_copy,
    "dim_order_ops::_to_dim_order_copy.out": _dim_order_copy,
    "executorch_prim::sym_size.int": _sym_size,
    "executorch_prim::sym_numel.default": _sym_numel,
    "executorch_prim::et_view.default": _et_view,
    "executorch_prim::neg.Scalar": _prim_neg,
    **{f"executorch_prim::{name}.Scalar": _prim_binary(fn) for name, fn in _PRIM_BINARY.items()},
    **{f"executorch_prim::{name}.int": _prim_binary(fn) for name, fn in _PRIM_BINARY.items()},
}


def find_overload(name: str, overload: str):
    """The `torch.ops` overload of operator `name.overload`, None when torch has none."""
    namespace, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def convert(argument, value):
    """A plan value as the schema `argument` takes it (dtype codes to torch dtypes, ...)."""
    convert_ = _converter(str(argument.type))
    return value if convert_ is None else convert_(value)


def _converter(type_name: str) -> Callable | None:
    """How an argument of this schema type arrives as a plan value and must be passed."""
    base = type_name.rstrip("?")
    if base == "ScalarType":
        return lambda v: v if v is None else DTYPES[v]
    if base == "MemoryFormat":
        return lambda v: v if v is None else _MEMORY_FORMATS[v]
    if base == "Layout":
        return lambda v: v if v is None else torch.strided
    if base == "Device":
        return lambda v: v if v is None else "cpu"
    return None


def _generic(op, dynamic: bool) -> Kernel:
    """Call the `torch.ops` overload with the plan's values: positional arguments in order,
    keyword-only ones (`out` among them) by name; returns are already the out tensors.

    In a program with dynamic shapes the out tensors are emptied first, so that the op
    sizes them (within their planned slot) without warning about a resize.
    """
    args = op._schema.arguments
    positional = sum(1 for a in args if not a.kwarg_only)
    names = [a.name for a in args]
    converters = [(i, c) for i, a in enumerate(args) if (c := _converter(str(a.type))) is not None]
    outs = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write] if dynamic else []
    n = len(args)
    # A functional op (aten::sym_size.int, ...) returns its value: store it in the return slot.
    functional = len(op._schema.returns) == 1 and op._schema.returns[0].alias_info is None

    def kernel(values, ids):
        vals = [values[i] for i in ids[:n]]
        for i, convert in converters:
            vals[i] = convert(vals[i])
        for i in outs:
            vals[i].resize_(0)
        result = op(*vals[:positional], **dict(zip(names[positional:], vals[positional:])))
        if functional:
            values[ids[n]] = result

    return kernel


def resolve(name: str, overload: str, dynamic: bool = False) -> Kernel | None:
    """The kernel of operator `name.overload`, None when it is unknown."""
    special = _SPECIAL.get(f"{name}.{overload}")
    if special is not None:
        return special
    op = find_overload(name, overload)
    return None if op is None else _generic(op, dynamic)
