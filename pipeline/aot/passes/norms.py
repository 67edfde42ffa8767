"""Norms in every form export gives them, each made the one op the partitioner tags.

RMSNorm becomes `aten.rms_norm(x, normalized_shape, weight, eps)`: from `aten.rms_norm`
itself (kept), `aten._fused_rms_norm` (what CUDA and MPS export), and the chains written
with plain ops (Hugging Face's LlamaRMSNorm and its kin: an upcast to float32, pow 2, mean
over the last dim, + eps, rsqrt, multiply, a cast back, the weight before or after that cast;
Gemma's `1 + weight`; T5's, which multiplies the uncast input; GLM-5's unweighted one, which
casts the rsqrt to the input's dtype before the multiply; HY-V4's, whose rsqrt scales a
bias-free linear of the same rows, `linear(x, W) * rsqrt(mean(x^2) + eps)`: since the factor is
one number per row, that is `linear(x * rsqrt(...), W)`, and the linear then takes the norm's
output). A LayerNorm written by hand
(mean, variance as mean((x - mean)^2), var(correction=0) or mean(x^2) - mean^2, rsqrt or
1 / sqrt, optional weight and bias) becomes `aten.native_layer_norm` and its `getitem 0`.

The match is exact: statistics over exactly the trailing dims with keepdim, biased variance,
eps added to the variance inside the rsqrt, the weight applied before the bias, each
intermediate used by nothing outside the chain. A chain that looks like a norm and misses one
of these is left as it is and reported with the reason; so is an exact match the kernel cannot
run (the partitioner's `unsupported_reason`). Only the rounding may differ: the op computes
in float32 and rounds once where a chain in half may round twice, and HY-V4's linear sums
normalized values where the chain scaled its sums.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram

from pipeline.aot.partitioner import unsupported_reason

aten = torch.ops.aten

LAYER_NORM = "LayerNorm"
GROUP_NORM = "GroupNorm"
RMS_NORM = "RMSNorm"
HAND_WRITTEN = "hand-written LayerNorm"
NORM_KINDS = (LAYER_NORM, GROUP_NORM, RMS_NORM, HAND_WRITTEN)
# The kind of each norm node of the exported graph. `meta["custom"]` carries the same kind
# and the node's name through to_edge (into delegates, and onto the ops a norm decomposes to).
KIND_KEY = "pipeline_norm_kind"
NAME_KEY = "pipeline_norm"

ATEN_RMS_NORM = aten.rms_norm.default
ATEN_LAYER_NORMS = (aten.layer_norm.default, aten.native_layer_norm.default)
ATEN_GROUP_NORMS = (aten.group_norm.default, aten.native_group_norm.default)

_CASTS = (aten.to.dtype, aten._to_copy.default, aten.type_as.default, aten.to.dtype_layout)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_ADDS = (aten.add.Tensor, aten.add.Scalar)
_MEAN = aten.mean.dim
_VARS = (aten.var.correction, aten.var.dim)
_ASSERT = aten._assert_tensor_metadata.default


@dataclass(frozen=True)
class LeftNorm:
    """A chain that looks like a norm and stays as it is: a near miss, or a match the kernel
    cannot run."""

    node: str  # the rsqrt (or sqrt) of the chain
    kind: str  # the norm it resembles: RMS_NORM or HAND_WRITTEN
    reason: str


@dataclass
class NormMatches:
    """What `match_norms` found: the norm ops it made or kept, by node name, and the chains
    it left."""

    made: dict[str, str] = field(default_factory=dict)  # node name -> kind
    left: list[LeftNorm] = field(default_factory=list)

    @property
    def near_misses(self) -> list[tuple[str, str]]:
        """(node, reason) of each chain left on the CPU."""
        return [(n.node, n.reason) for n in self.left]

    def count(self, kind: str) -> int:
        return sum(1 for k in self.made.values() if k == kind)


def norm_kind(node: torch.fx.Node) -> str | None:
    """The kind of a norm node (aten or edge dialect): what `match_norms` marked, else read
    from the op (a LayerNorm whose metadata says it was a GroupNorm is one); None for other
    nodes."""
    kind = node.meta.get(KIND_KEY) or (node.meta.get("custom") or {}).get(KIND_KEY)
    name = _op_name(node)
    if name == "aten::rms_norm" or name == "aten::_fused_rms_norm":
        return RMS_NORM
    if name in ("aten::native_layer_norm", "aten::layer_norm"):
        return kind if kind in (HAND_WRITTEN, GROUP_NORM, LAYER_NORM) else GROUP_NORM if _from_group_norm(node) else LAYER_NORM
    if name in ("aten::native_group_norm", "aten::group_norm"):
        return GROUP_NORM
    return None


def match_norms(ep: ExportedProgram) -> tuple[ExportedProgram, NormMatches]:
    """Rewrite every RMSNorm and hand-written LayerNorm of `ep` (its top-level graph) into
    one aten.rms_norm or aten.native_layer_norm; mark every norm node with its kind.

    In place; returns `ep` and what was found. Nodes made are marked
    `meta[KIND_KEY]`, and `meta["custom"]` holds the kind and the node's name."""
    graph = ep.graph
    found = NormMatches()
    live = _live(graph)
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue  # erased by an earlier match
        if node.target == aten._fused_rms_norm.default:
            node = _from_fused(graph, node)
        if node.target == ATEN_RMS_NORM:
            _explicit_eps(node)
            _mark(node, RMS_NORM, found)
        elif node.target in ATEN_LAYER_NORMS + ATEN_GROUP_NORMS:
            _mark(node, norm_kind(node), found)
        elif node.target in _ANCHORS and node in live:
            chain = _match(node)
            if isinstance(chain, LeftNorm):
                found.left.append(chain)
            elif chain is not None:
                made = _rewrite(graph, chain)
                if isinstance(made, LeftNorm):
                    found.left.append(made)
                else:
                    _mark(made, chain.kind, found)
    graph.lint()
    ep.graph_module.recompile()
    return ep, found


# -- the match ---------------------------------------------------------------------------

_ANCHORS = (aten.rsqrt.default, aten.sqrt.default, aten.pow.Tensor_Scalar)


@dataclass
class _Chain:
    kind: str
    anchor: torch.fx.Node
    x: torch.fx.Node  # the chain's input, before its upcast
    dims: int  # how many trailing dims it normalizes
    eps: float
    weight: torch.fx.Node | None
    bias: torch.fx.Node | None
    final: torch.fx.Node
    inner: list[torch.fx.Node]  # what the op replaces: used by nothing outside the chain
    upcasts: list[torch.fx.Node]  # casts of x: removed when nothing else uses them
    linear: torch.fx.Node | None = None  # the bias-free linear of x the factor scales, if that


class _Miss(Exception):
    """A norm-like chain that is not exactly a norm."""


def _match(anchor: torch.fx.Node) -> _Chain | LeftNorm | None:
    """The norm whose rsqrt (sqrt, pow -0.5) is `anchor`; None when `anchor` does not take
    a variance at all; LeftNorm when the chain looks like a norm and is not one."""
    if anchor.target == aten.pow.Tensor_Scalar and anchor.args[1] != -0.5:
        return None
    inner = [anchor]
    stat, eps = _eps_added(_arg(anchor, 0))
    if stat is None:
        return None
    kind = HAND_WRITTEN if stat.target in _VARS or stat.target == aten.sub.Tensor else RMS_NORM
    if stat.target != _MEAN and kind == RMS_NORM:
        return None
    if stat.target == _MEAN and _squared(_arg(stat, 0)) is None:
        return None
    try:
        if eps is None:
            raise _Miss(f"eps is not added to the variance inside the {_short(anchor)}")
        if stat is not _arg(anchor, 0):
            inner.append(_arg(anchor, 0))
        x, centred, dims = _statistic(stat, inner)
        kind = HAND_WRITTEN if centred is not None else RMS_NORM
        root_x = _root(x)
        normed, factor = _normalized(anchor, inner, _val(root_x).dtype)
        scaled = _other(normed, factor) if normed.target == aten.mul.Tensor else _arg(normed, 0)
        upcasts = [n for n in _upcasts(x) if n is not root_x]
        if centred is None and dims == 1 and _bias_free_linear(scaled, x):
            # linear(x, W) * rstd: the norm moves before the linear, which is then its only tail.
            inner.append(scaled)
            _exclusive(inner, normed, upcasts)
            return _Chain(kind, anchor, scaled.args[0], dims, eps, None, None, normed, inner, upcasts, scaled)
        if not _same_centred(scaled, centred, x):
            what = "x" if centred is None else "x - mean(x)"
            raise _Miss(f"it scales {getattr(scaled, 'name', scaled)}, not the {what} of its statistics")
        if centred is not None and scaled is not centred:
            inner.extend([scaled, scaled.args[1]])
        weight, bias, final = _tail(normed, kind, dims, root_x, inner)
        _exclusive(inner, final, upcasts)
        return _Chain(kind, anchor, root_x, dims, eps, weight, bias, final, inner, upcasts)
    except _Miss as miss:
        return LeftNorm(anchor.name, kind, f"{miss}{_where(anchor)}")


def _eps_added(node: torch.fx.Node | None) -> tuple[torch.fx.Node | None, float | None]:
    """(the variance, eps) of `variance + eps`; (the variance, None) of a variance alone;
    (None, None) when `node` is neither."""
    if node is None or node.op != "call_function":
        return None, None
    if node.target in _ADDS and not node.kwargs:
        a, b = node.args[0], node.args[1]
        for stat, eps in ((a, b), (b, a)):
            if isinstance(stat, torch.fx.Node) and _is_variance(stat) and isinstance(eps, (int, float)):
                return stat, float(eps)
        return None, None
    return (node, None) if _is_variance(node) else (None, None)


def _is_variance(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target == _MEAN:
        return _squared(_arg(node, 0)) is not None
    if node.target in _VARS:
        return True
    # mean(x^2) - mean(x)^2
    return (node.target == aten.sub.Tensor and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target == _MEAN and _squared(node.args[1]) is not None)


def _statistic(stat: torch.fx.Node, inner: list) -> tuple[torch.fx.Node, torch.fx.Node | None, int]:
    """(x, the centred x or None, dims) of a variance or mean of squares, checked exact."""
    inner.append(stat)
    if stat.target in _VARS:
        x = _arg(stat, 0)
        dims = _reduced(stat, x)
        correction = stat.kwargs.get("correction", 1 if stat.target == aten.var.correction else None)
        if stat.target == aten.var.dim:
            unbiased = stat.args[2] if len(stat.args) > 2 else stat.kwargs.get("unbiased", True)
            correction = 1 if unbiased else 0
        if correction != 0:
            raise _Miss(f"its variance is unbiased (correction {correction}); a norm's is biased")
        return x, _VarCentred(dims), dims
    if stat.target == aten.sub.Tensor:
        # mean(x^2) - mean(x)^2: both means over the same x and dims.
        mean_sq, sq_mean = stat.args
        x = _squared(_arg(mean_sq, 0))
        mean = _squared(sq_mean)
        inner.extend([mean_sq, _arg(mean_sq, 0), sq_mean])
        if mean is None or mean.target != _MEAN or _root(_arg(mean, 0)) is not _root(x):
            raise _Miss("its variance is mean(x^2) minus the square of something other than mean(x)")
        dims = _reduced(mean_sq, x)
        if _reduced(mean, x) != dims:
            raise _Miss("its mean and its mean of squares reduce different dims")
        inner.append(mean)
        return x, _MeanRef(mean), dims
    squared = _arg(stat, 0)
    inner.append(squared)
    base = _squared(squared)
    if base.target == aten.sub.Tensor and isinstance(base.args[1], torch.fx.Node) and base.args[1].target == _MEAN:
        # mean((x - mean(x))^2)
        x, mean = _arg(base, 0), base.args[1]
        if _root(_arg(mean, 0)) is not _root(x):
            raise _Miss("it centres on the mean of another tensor")
        dims = _reduced(stat, x)
        if _reduced(mean, x) != dims:
            raise _Miss("its mean and its variance reduce different dims")
        inner.extend([base, mean])
        return x, base, dims
    return base, None, _reduced(stat, base)


class _MeanRef:
    """The centred input a variance implies: x - this mean."""

    def __init__(self, mean: torch.fx.Node) -> None:
        self.mean = mean


class _VarCentred:
    """The centred input var(x) implies: x - a mean of x over the same `dims`."""

    def __init__(self, dims: int) -> None:
        self.dims = dims


def _reduced(reduction: torch.fx.Node, x: torch.fx.Node) -> int:
    """How many trailing dims a mean or var over `x` reduces, with keepdim; _Miss otherwise."""
    val = _val(x)
    if val is None:
        raise _Miss(f"{x.name} has no tensor metadata")
    ndim = val.dim()
    args = list(reduction.args) + [None] * 3
    dims = args[1] if args[1] is not None else reduction.kwargs.get("dim")
    keepdim = reduction.kwargs.get("keepdim", args[2] if reduction.target == _MEAN else
                                   args[3] if reduction.target == aten.var.dim else False)
    if reduction.target == aten.var.correction:
        keepdim = reduction.kwargs.get("keepdim", False)
    if reduction.kwargs.get("dtype") is not None:
        raise _Miss(f"{reduction.name} reduces in {reduction.kwargs['dtype']}")
    if dims is None or ndim == 0:
        raise _Miss(f"{reduction.name} reduces every dim")
    dims = [dims] if isinstance(dims, int) else list(dims)
    got = sorted(d % ndim for d in dims)
    if got != list(range(ndim - len(got), ndim)):
        raise _Miss(f"{reduction.name} reduces dims {dims} of a {ndim}-dim input, not the trailing ones")
    if not keepdim:
        raise _Miss(f"{reduction.name} does not keep the reduced dims")
    return len(got)


def _normalized(anchor: torch.fx.Node, inner: list, dtype: torch.dtype) -> tuple[torch.fx.Node, torch.fx.Node]:
    """(the node that scales the input by the anchor's 1 / sqrt(var + eps), the factor it
    takes: the anchor, its reciprocal, or that cast to float32 or to the input's `dtype`)."""
    users = list(anchor.users)
    if anchor.target == aten.sqrt.default:
        if len(users) == 1 and users[0].target == aten.reciprocal.default:
            inner.append(users[0])
            anchor, users = users[0], list(users[0].users)
        elif len(users) == 1 and users[0].target == aten.div.Tensor and users[0].args[1] is anchor:
            inner.append(users[0])
            return users[0], anchor
        else:
            raise _Miss(f"{anchor.name} is not a divisor of the input")
    # x * rsqrt(...).to(x.dtype) (GLM-5's unweighted RMSNorm): the factor cast, its metadata
    # assert beside it; in half the chain rounds the factor, the op does not.
    casts = [u for u in users if u.target != _ASSERT]
    if len(casts) == 1 and _cast_to(casts[0]) in (torch.float32, dtype) and casts[0].args[0] is anchor:
        inner.append(casts[0])
        anchor, users = casts[0], list(casts[0].users)
    muls = [u for u in users if u.target == aten.mul.Tensor]
    if len(muls) != 1:
        raise _Miss(f"{anchor.name} is used by {_names(users)}, not by one multiply of the input")
    if len(users) > 1:
        raise _Miss(f"its intermediate {anchor.name} is also used by {_names(u for u in users if u not in muls)}")
    inner.append(muls[0])
    return muls[0], anchor


def _tail(normed: torch.fx.Node, kind: str, dims: int, x: torch.fx.Node,
          inner: list) -> tuple[torch.fx.Node | None, torch.fx.Node | None, torch.fx.Node]:
    """(weight, bias, final node) after the normalized value: casts, a multiply by a weight
    of the normalized shape, and for a LayerNorm then an add of a bias."""
    shape = tuple(_val(normed).shape[-dims:])
    weight = bias = None
    cur = normed
    while True:
        # The metadata asserts export puts before each .to() use nothing: _erase drops them.
        users = [u for u in cur.users if u.target != _ASSERT]
        if len(users) != 1:
            break
        user = users[0]
        if user.op != "call_function":
            break
        if _cast_to(user) in _FLOATS and user.args[0] is cur:
            step = user
        elif weight is None and bias is None and user.target == aten.mul.Tensor and _affine(user, cur, shape, x):
            step, weight = user, _other(user, cur)
        elif kind == HAND_WRITTEN and bias is None and user.target == aten.add.Tensor and not user.kwargs \
                and _affine(user, cur, shape, x):
            step, bias = user, _other(user, cur)
        else:
            break
        inner.append(cur)
        cur = step
    return _uncast(weight, x), _uncast(bias, x), cur


def _affine(node: torch.fx.Node, cur: torch.fx.Node, shape: tuple, x: torch.fx.Node) -> bool:
    other = _other(node, cur)
    val = _val(other) if isinstance(other, torch.fx.Node) else None
    return val is not None and tuple(val.shape) == shape and val.dtype in _FLOATS and not _depends_on(other, x)


def _uncast(t: torch.fx.Node | None, x: torch.fx.Node) -> torch.fx.Node | None:
    """A weight or bias without its exact upcast to float32 when it is in x's dtype (the
    kernel reads it as it is stored)."""
    if t is not None and _cast_to(t) == torch.float32 and isinstance(t.args[0], torch.fx.Node):
        src = _val(t.args[0])
        if src is not None and src.dtype == _val(_root(x)).dtype:
            return t.args[0]
    return t


def _exclusive(inner: list, final: torch.fx.Node, upcasts: list) -> None:
    chain = set(inner) | {final} | set(upcasts)
    for node in inner:
        if node is final:
            continue
        outside = [u for u in node.users if u not in chain and u.target != _ASSERT]
        if outside:
            raise _Miss(f"its intermediate {node.name} is also used by {_names(outside)}")


# -- the rewrite -------------------------------------------------------------------------

def _rewrite(graph: torch.fx.Graph, chain: _Chain) -> torch.fx.Node | LeftNorm:
    """Put the norm op in place of the chain's final node; LeftNorm when the kernel cannot
    run it (the chain then stays)."""
    x_val = _val(chain.x)
    shape = [d for d in x_val.shape[x_val.dim() - chain.dims:]]
    if not all(type(d) is int for d in shape):
        return LeftNorm(chain.anchor.name, chain.kind, f"normalized dims {[str(d) for d in shape]} are not static"
                        f"{_where(chain.anchor)}")
    with graph.inserting_before(chain.final):
        if chain.kind == RMS_NORM:
            norm = graph.call_function(ATEN_RMS_NORM, (chain.x, shape, chain.weight, chain.eps))
            out = norm
        else:
            norm = graph.call_function(aten.native_layer_norm.default,
                                       (chain.x, shape, chain.weight, chain.bias, chain.eps))
        _copy_meta(norm, chain.anchor)
        norm.meta["val"] = _fake(norm)
        reason = unsupported_reason(norm)
        if reason is not None:
            graph.erase_node(norm)
            return LeftNorm(chain.anchor.name, chain.kind, f"{reason}{_where(chain.anchor)}")
        if chain.kind != RMS_NORM:
            out = graph.call_function(operator.getitem, (norm, 0))
            _copy_meta(out, chain.anchor)
            out.meta["val"] = norm.meta["val"][0]
        if chain.linear is not None:
            out = graph.call_function(aten.linear.default, (norm, chain.linear.args[1]))
            _copy_meta(out, chain.linear)
            out.meta["val"] = _fake(out)
        want = _val(chain.final).dtype
        if out.meta["val"].dtype != want:
            out = graph.call_function(aten._to_copy.default, (out,), {"dtype": want})
            _copy_meta(out, chain.anchor)
            out.meta["val"] = _fake(out)
    chain.final.replace_all_uses_with(out)
    _erase(graph, [*chain.inner, chain.final, *chain.upcasts])
    return norm


def _erase(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Erase what the chain was, with the metadata asserts on it, last first, each once
    nothing uses it."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in sorted(set(nodes), key=order.__getitem__, reverse=True):
        for user in list(node.users):
            if user.target == _ASSERT:
                graph.erase_node(user)
        if not node.users:
            graph.erase_node(node)


def _from_fused(graph: torch.fx.Graph, fused: torch.fx.Node) -> torch.fx.Node:
    """aten._fused_rms_norm -> aten.rms_norm, and its rstd (where used) as aten computes it."""
    x, shape, weight, eps = (list(fused.args) + [None] * 4)[:4]
    eps = _default_eps(x) if eps is None else float(eps)
    with graph.inserting_before(fused):
        norm = graph.call_function(ATEN_RMS_NORM, (x, list(shape), weight, eps))
        _copy_meta(norm, fused)
        norm.meta["val"] = _fake(norm)
    for user in list(fused.users):
        if user.target is operator.getitem and user.args[1] == 0:
            user.replace_all_uses_with(norm)
        elif user.target is operator.getitem and user.args[1] == 1 and user.users:
            with graph.inserting_before(user):
                rstd = _rstd(graph, x, len(shape), eps)
            user.replace_all_uses_with(rstd)
        graph.erase_node(user)
    graph.erase_node(fused)
    return norm


def _rstd(graph: torch.fx.Graph, x: torch.fx.Node, dims: int, eps: float) -> torch.fx.Node:
    """1 / sqrt(mean(x^2) + eps) in float32 over the trailing `dims`, keepdim: _fused_rms_norm's rstd."""
    node = x
    for op, args in ((aten._to_copy.default, ()), (aten.pow.Tensor_Scalar, (2,)),
                     (_MEAN, (list(range(-dims, 0)), True)), (aten.add.Tensor, (eps,)), (aten.rsqrt.default, ())):
        kwargs = {"dtype": torch.float32} if op == aten._to_copy.default else {}
        node = graph.call_function(op, (node, *args), kwargs)
        _copy_meta(node, x)
        node.meta["val"] = _fake(node)
    return node


def _explicit_eps(node: torch.fx.Node) -> None:
    x, shape, weight, eps = (list(node.args) + [None] * 4)[:4]
    eps = node.kwargs.get("eps", eps)
    weight = node.kwargs.get("weight", weight)
    node.args = (x, shape, weight, _default_eps(x) if eps is None else float(eps))
    node.kwargs = {}


def _default_eps(x: torch.fx.Node) -> float:
    # aten.rms_norm's default: the machine epsilon of x's dtype.
    return torch.finfo(_val(x).dtype).eps


def _mark(node: torch.fx.Node, kind: str, found: NormMatches) -> None:
    node.meta[KIND_KEY] = kind
    node.meta["custom"] = {**(node.meta.get("custom") or {}), KIND_KEY: kind, NAME_KEY: node.name}
    found.made[node.name] = kind


def _copy_meta(node: torch.fx.Node, source: torch.fx.Node) -> None:
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack", "torch_fn"):
        if key in source.meta:
            node.meta[key] = source.meta[key]


def _fake(node: torch.fx.Node):
    def val(a):
        return a.meta["val"] if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, val)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, val)
    mode = detect_fake_mode([v for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)])
    with mode:
        return node.target(*args, **kwargs)


# -- small helpers -----------------------------------------------------------------------

def _op_name(node: torch.fx.Node) -> str:
    if node.op != "call_function":
        return ""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        op = getattr(node.target, "_op", None)  # exir's EdgeOpOverload wraps the aten overload
        schema = getattr(op, "_schema", None)
    return schema.name if schema is not None else ""


def _from_group_norm(node: torch.fx.Node) -> bool:
    original = node.meta.get("original_aten")
    if original is not None and "group_norm" in str(original):
        return True
    stack = node.meta.get("nn_module_stack") or {}
    return bool(stack) and str(list(stack.values())[-1][1]).rsplit(".", 1)[-1].strip("'>") == "GroupNorm"


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _arg(node: torch.fx.Node, i: int) -> torch.fx.Node | None:
    a = node.args[i] if len(node.args) > i else None
    return a if isinstance(a, torch.fx.Node) else None


def _other(node: torch.fx.Node, one) -> object:
    a, b = node.args[0], node.args[1]
    return b if a is one else a


def _squared(node) -> torch.fx.Node | None:
    """x of x^2 (pow 2, square, x * x)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target == aten.pow.Tensor_Scalar and node.args[1] == 2 and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    if node.target == aten.square.default:
        return _arg(node, 0)
    if node.target == aten.mul.Tensor and node.args[0] is node.args[1] and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return None


def _cast_to(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype a dtype-only cast makes; None for other nodes."""
    if node.op != "call_function" or node.target not in _CASTS:
        return None
    if node.target == aten.type_as.default:
        other = _val(node.args[1])
        return other.dtype if other is not None else None
    if any(k in node.kwargs and node.kwargs[k] is not None for k in ("device", "layout", "memory_format")):
        if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
            return None
    dtype = node.args[1] if node.target == aten.to.dtype and len(node.args) > 1 else node.kwargs.get("dtype")
    return dtype if isinstance(dtype, torch.dtype) else None


def _upcasts(x: torch.fx.Node) -> list[torch.fx.Node]:
    """x and the exact casts it came through (to float32 from a narrower float, or to its own dtype)."""
    found = [x]
    while _cast_to(found[-1]) is not None and isinstance(found[-1].args[0], torch.fx.Node):
        src, dst = _val(found[-1].args[0]), _val(found[-1])
        if src is None or dst is None or not (src.dtype == dst.dtype or (
                dst.dtype == torch.float32 and src.dtype in (torch.float16, torch.bfloat16))):
            break
        found.append(found[-1].args[0])
    return found


def _root(x) -> torch.fx.Node | None:
    return _upcasts(x)[-1] if isinstance(x, torch.fx.Node) else None


def _same_centred(scaled, centred, x: torch.fx.Node) -> bool:
    """Whether `scaled` is the input the statistics were taken of: x for an RMS (centred
    None), x - mean(x) for a LayerNorm."""
    if not isinstance(scaled, torch.fx.Node):
        return False
    if centred is None:
        return _root(scaled) is _root(x)
    if scaled is centred:
        return True
    if scaled.target != aten.sub.Tensor or _root(_arg(scaled, 0)) is not _root(x):
        return False
    mean = scaled.args[1]
    if isinstance(centred, torch.fx.Node):
        return mean is centred.args[1]
    if isinstance(centred, _MeanRef):
        return mean is centred.mean
    # var(x): a mean of x over the same dims, keepdim
    return (isinstance(mean, torch.fx.Node) and mean.target == _MEAN and _root(_arg(mean, 0)) is _root(x)
            and _reduced(mean, x) == centred.dims)


def _bias_free_linear(node, x: torch.fx.Node) -> bool:
    """Whether `node` is `linear(x, W)` with no bias, x the statistics' input (or a cast of it)
    and W not computed from x."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target != aten.linear.default:
        return False
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    weight = node.args[1]
    return (bias is None and isinstance(node.args[0], torch.fx.Node) and _root(node.args[0]) is _root(x)
            and isinstance(weight, torch.fx.Node) and not _depends_on(weight, x))


def _depends_on(node: torch.fx.Node, x: torch.fx.Node) -> bool:
    seen, pending = set(), [node]
    while pending:
        n = pending.pop()
        if n is x:
            return True
        if n not in seen:
            seen.add(n)
            pending.extend(n.all_input_nodes)
    return False


def _live(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    live: set[torch.fx.Node] = set()
    pending = [n for n in graph.nodes if n.op == "output"]
    while pending:
        node = pending.pop()
        if node not in live:
            live.add(node)
            pending.extend(node.all_input_nodes)
    return live


def _names(nodes) -> str:
    return ", ".join(n.name for n in nodes) or "nothing"


def _short(anchor: torch.fx.Node) -> str:
    return "sqrt" if anchor.target == aten.sqrt.default else "rsqrt"


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return f" (in {path})" if path else ""
