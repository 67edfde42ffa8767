"""The operator table: each `KernelCall` operator of a program -> a Python kernel.

A kernel is `kernel(values, ids)`: `ids` are the instruction's value indices (every schema
argument in schema order, then the returns), `values` the plan's live values. Out-variant
kernels write into their planned out tensors in place; ExecuTorch's primitive ops
(`executorch_prim::*`) compute SymInt values. Most operators map to the `torch.ops`
overload of the same name. Copy-shaped ones take a faster path: torch generates the out
variants of `*_copy` views and of `full_like` as the functional op into a fresh tensor,
then a copy into `out` (an allocation and two passes: a `full_like` of Whisper's attention
scores takes 27 ms that way, a `fill_` 3 ms); here they are the view and one `copy_`, or
one `fill_`, with the same values. `any` over a dim of bools is their max, which torch
reduces about ten times faster (the safe softmax of exported attention asks it of every
score matrix).
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


def _view_copy(values, ids):
    x, size, out = values[ids[0]], values[ids[1]], values[ids[2]]
    view = x.reshape(size)
    resized(out, view.shape).copy_(view)


def _full_like(values, ids):
    # full_like.out(self, fill_value, *, memory_format, out): the planned out tensor has the
    # dtype and layout; fill_ converts the value as full_like does.
    x, fill, out = values[ids[0]], values[ids[1]], values[ids[3]]
    resized(out, x.shape).fill_(fill)


def _any(values, ids):
    # any.out(self, dim, keepdim, *, out)
    x, dim, keepdim, out = values[ids[0]], values[ids[1]], values[ids[2]], values[ids[3]]
    if x.dtype != torch.bool or out.dtype != torch.bool or x.dim() == 0 or x.shape[dim] == 0:
        torch.ops.aten.any.out(x, dim, keepdim, out=out)
        return
    found = torch.amax(x.view(torch.uint8), dim, keepdim)
    torch.ne(found, 0, out=resized(out, found.shape))  # true as torch's any has it, whatever byte a true holds


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
    "aten::view_copy.out": _view_copy,  # reshape: a view_copy's input need not be viewable
    "aten::full_like.out": _full_like,
    "aten::any.out": _any,
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


def _view_of(op) -> tuple[object, int, list[str]] | None:
    """For the out variant of a `*_copy` operator (`aten::slice_copy.Tensor_out`): its view
    operator (`aten::slice.Tensor`), which takes the same arguments but `out` and returns a
    view of `self`, how many arguments it takes, and which of them by name; else None."""
    schema = op._schema
    name, overload = schema.name, schema.overload_name
    if not name.endswith("_copy") or not (overload == "out" or overload.endswith("_out")):
        return None
    view = find_overload(name.removesuffix("_copy"), overload.removesuffix("out").removesuffix("_") or "default")
    if view is None:
        return None
    args = [a for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
    view_args = view._schema.arguments
    returns = view._schema.returns
    one_tensor = len(schema.arguments) == len(args) + 1 and len(returns) == 1 and str(returns[0].type) == "Tensor"
    if not one_tensor or [(a.name, str(a.type)) for a in args] != [(a.name, str(a.type)) for a in view_args] \
            or returns[0].alias_info is None or returns[0].alias_info.is_write \
            or any(_converter(str(a.type)) for a in args):
        return None
    return view, len(args), [a.name for a in view_args if a.kwarg_only]


def _view_then_copy(view, n: int, named: list[str]) -> Kernel:
    """The view of the instruction's `n` arguments, then one copy into its out tensor."""
    positional = n - len(named)

    def kernel(values, ids):
        vals = [values[i] for i in ids[:n]]
        result = view(*vals[:positional], **dict(zip(named, vals[positional:])))
        resized(values[ids[n]], result.shape).copy_(result)

    return kernel


def resolve(name: str, overload: str, dynamic: bool = False) -> Kernel | None:
    """The kernel of operator `name.overload`, None when it is unknown."""
    special = _SPECIAL.get(f"{name}.{overload}")
    if special is not None:
        return special
    op = find_overload(name, overload)
    if op is None:
        return None
    view = _view_of(op)
    return _generic(op, dynamic) if view is None else _view_then_copy(*view)
