"""The operator table's faster paths (`pipeline.pte.operators`) give what torch's own out
variants give, bit for bit: `*_copy` views as a view and one copy, `full_like` as a fill,
`any` over bools as a max."""

import pytest
import torch

from pipeline.pte import operators


def run(name: str, overload: str, args: list, out: torch.Tensor) -> torch.Tensor:
    """Run the table's kernel for `name.overload` on `args`, writing `out` (also the return)."""
    values = [*args, out, out]
    operators.resolve(name, overload)(values, list(range(len(values))))
    return out


def reference(name: str, overload: str, args: list, out: torch.Tensor, **named) -> torch.Tensor:
    operators.find_overload(name, overload)(*args, **named, out=out)
    return out


def x_of(*shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


COPIES = [
    ("aten::slice_copy", "Tensor_out", lambda x: [x, 1, 1, None, 2]),
    ("aten::squeeze_copy", "dims_out", lambda x: [x.unsqueeze(0), [0]]),
    ("aten::unsqueeze_copy", "out", lambda x: [x, 1]),
    ("aten::alias_copy", "out", lambda x: [x]),
    ("aten::permute_copy", "out", lambda x: [x, [2, 0, 1]]),
    ("aten::select_copy", "int_out", lambda x: [x, 1, -1]),
    ("aten::transpose_copy", "int_out", lambda x: [x, 0, 2]),
]


@pytest.mark.parametrize("name, overload, make", COPIES, ids=[c[0].split("::")[1] for c in COPIES])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_copy_views_equal_torchs_out_variants(name, overload, make, layout):
    x = x_of(3, 5, 4)
    if layout == "strided":
        x = x_of(4, 5, 3).permute(2, 1, 0)
    args = make(x)
    want = reference(name, overload, args, torch.empty(0))
    got = run(name, overload, args, torch.empty(want.shape))
    assert got.shape == want.shape and torch.equal(got, want)


def test_expand_copy_passes_implicit_by_name():
    x = x_of(1, 4, 1)
    want = reference("aten::expand_copy", "out", [x, [2, 4, 3]], torch.empty(0), implicit=False)
    values = [x, [2, 4, 3], False, torch.empty(2, 4, 3), None]
    operators.resolve("aten::expand_copy", "out")(values, [0, 1, 2, 3, 4])
    assert torch.equal(values[3], want)


def test_a_planned_out_tensor_is_resized_within_its_slot():
    # Dynamic programs plan the upper bound: the copy shrinks the out tensor to the view.
    x = x_of(2, 6, 4)
    out = torch.empty(2, 8, 4)
    got = run("aten::slice_copy", "Tensor_out", [x, 1, 0, 3, 1], out)
    assert got.shape == (2, 3, 4) and torch.equal(got, x[:, :3])


@pytest.mark.parametrize("fill, dtype", [(0, torch.float32), (-1.5, torch.float32), (float("-inf"), torch.float16),
                                         (3, torch.int64), (1, torch.bool)])
def test_full_like_is_one_fill(fill, dtype):
    x = x_of(4, 7).to(dtype)
    want = reference("aten::full_like", "out", [x, fill], torch.empty(0, dtype=dtype))
    values = [x, fill, None, torch.empty(4, 7, dtype=dtype), None]
    operators.resolve("aten::full_like", "out")(values, [0, 1, 2, 3, 4])
    assert values[3].dtype == want.dtype and torch.equal(values[3], want)


@pytest.mark.parametrize("shape, dim, keepdim", [((2, 3, 50), -1, True), ((2, 3, 50), 1, False), ((4, 0), 1, True),
                                                 ((0, 4), 1, False), ((), 0, False)])
def test_any_over_bools_is_torchs_any(shape, dim, keepdim):
    x = x_of(*shape) > 1.2 if shape else torch.tensor(True)
    want = reference("aten::any", "out", [x, dim, keepdim], torch.empty(0, dtype=torch.bool))
    got = run("aten::any", "out", [x, dim, keepdim], torch.empty(want.shape, dtype=torch.bool))
    assert got.shape == want.shape and torch.equal(got, want)


def test_any_of_other_dtypes_is_left_to_torch():
    x = torch.tensor([[0.0, 2.5], [0.0, 0.0]])
    got = run("aten::any", "out", [x, 1, False], torch.empty(2, dtype=torch.bool))
    assert got.tolist() == [True, False]


def test_a_true_of_any_byte_counts_as_true():
    x = torch.tensor([[0, 7], [0, 0]], dtype=torch.uint8).view(torch.bool)
    got = run("aten::any", "out", [x, 1, True], torch.empty(2, 1, dtype=torch.bool))
    assert got.view(torch.uint8).flatten().tolist() == [1, 0]
