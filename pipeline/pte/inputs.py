"""A call's inputs held against the program before anything runs: the structure it was
exported with, then each tensor's kind, dtype and shape. Shared by both runtimes.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from executorch.exir import schema

from pipeline.pte import operators, verify


class SignatureError(ValueError):
    """The program's recorded input/output structure is corrupt."""


def specs(plan: schema.ExecutionPlan) -> tuple[pytree.TreeSpec | None, pytree.TreeSpec | None]:
    """The (inputs, outputs) structures the program was exported with; None where the file
    records none. SignatureError when either is corrupt or holds another number of values
    than the plan's inputs or outputs."""
    meta = plan.container_meta_type
    found = []
    for what, text, ids in (("inputs", meta.encoded_inp_str, plan.inputs),
                            ("outputs", meta.encoded_out_str, plan.outputs)):
        if not text:
            found.append(None)
            continue
        try:
            spec = pytree.treespec_loads(text)
        except Exception as exc:  # the loader raises whatever bad JSON leads to
            raise SignatureError(f"the program's {what} structure is corrupt: {exc}") from None
        if spec.num_leaves != len(ids):
            raise SignatureError(f"the program's {what} structure holds {spec.num_leaves} values, its plan "
                                 f"{len(ids)}")
        found.append(spec)
    return found[0], found[1]


def flatten(inputs: tuple, spec: pytree.TreeSpec | None, count: int) -> list:
    """The call's inputs as the plan's flat list; TypeError when their structure is not the
    program's (checked for depth first: a structure nested thousands deep is refused, not
    recursed into)."""
    limit = _depth(spec) if spec is not None else 2
    if _deeper_than((inputs, {}), limit):
        raise TypeError(f"inputs are nested deeper than the program's signature ({limit - 1} levels)")
    flat, given = pytree.tree_flatten((inputs, {}))
    if spec is not None and given != spec:
        raise TypeError(f"inputs do not match the program's signature: got {given}, expected {spec}")
    if len(flat) != count:
        raise TypeError(f"the program takes {count} inputs, got {len(flat)}")
    return flat


def _depth(spec: pytree.TreeSpec) -> int:
    children = spec.children()
    return 1 + max((_depth(c) for c in children), default=0) if children else 0


def _deeper_than(obj, limit: int) -> bool:
    """Whether containers (tuples, lists, dicts) nest in `obj` more than `limit` deep."""
    stack = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (tuple, list, dict)):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def checked(plan: schema.ExecutionPlan, spec: pytree.TreeSpec | None, inputs: tuple) -> list:
    """`inputs` flattened by `spec` and checked against what `plan` declares, input by input:
    a tensor by `check_tensor`, any other value equal to the one the program was exported
    with. TypeError or ValueError naming the input otherwise. Both runtimes take their
    inputs through this."""
    flat = flatten(inputs, spec, len(plan.inputs))
    for k, (j, given) in enumerate(zip(plan.inputs, flat)):
        declared = plan.values[j].val
        if isinstance(declared, schema.Tensor):
            check_tensor(k, declared, given)
            continue
        exported = verify.plain_value(declared, [])
        if given != exported:
            raise ValueError(f"input {k}: the program was exported for the value {exported!r}, got {given!r}")
    return flat


def check_tensor(k: int, declared: schema.Tensor, given) -> None:
    """Input `k` against the tensor the program declares: a dense CPU tensor of its dtype,
    of its shape (within its upper bounds where dynamic). TypeError or ValueError naming
    the input otherwise."""
    if not isinstance(given, torch.Tensor):
        raise TypeError(f"input {k} must be a torch.Tensor, got {type(given).__name__}")
    if given.is_nested:
        raise TypeError(f"input {k} is a nested tensor; the program takes dense tensors")
    if given.layout != torch.strided:
        raise TypeError(f"input {k} has layout {given.layout}; the program takes dense (strided) tensors")
    if given.device.type != "cpu":
        what = "a meta tensor, without data" if given.device.type == "meta" else f"on {given.device}"
        raise TypeError(f"input {k} is {what}; the program takes CPU tensors")
    dtype = operators.DTYPES[int(declared.scalar_type)]
    if given.dtype != dtype:
        raise TypeError(f"input {k} must be {dtype}, got {given.dtype}")
    bound = list(declared.sizes)
    shape = list(given.shape)
    static = declared.shape_dynamism == schema.TensorShapeDynamism.STATIC
    if len(shape) != len(bound) or any(s > b or (static and s != b) for s, b in zip(shape, bound)):
        what = "the shape" if static else "shapes within"
        raise ValueError(f"input {k} has shape {shape}, outside what the program was exported for "
                         f"({what} {bound})")


def dense_strides(sizes: list[int], dim_order: list[int]) -> list[int]:
    """The strides of a tensor of `sizes` whose elements lie densely in `dim_order`
    (outermost first)."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(sizes[d], 1)
    return strides


def laid_out(declared: schema.Tensor, given: torch.Tensor) -> torch.Tensor:
    """Input `given` (checked by `check_tensor`) as a runtime that reads an input's memory
    in the program's dim order takes it: a plain tensor, detached from autograd, its
    elements dense in the declared order. `given` itself (detached) when it is already so,
    else a copy: ExecuTorch's runtime reads a channels-last tensor given for a contiguous
    input as if it were contiguous, and refuses transposed, expanded or overlapping ones
    and Parameters."""
    tensor = given.detach()
    strides = dense_strides(list(tensor.shape), list(declared.dim_order))
    dense = all(size <= 1 or stride == want for size, stride, want in zip(tensor.shape, tensor.stride(), strides))
    if dense and type(tensor) is torch.Tensor and not (tensor.is_neg() or tensor.is_conj()):
        return tensor
    copy = torch.empty_strided(tensor.shape, strides, dtype=tensor.dtype)
    copy.copy_(tensor)
    return copy
