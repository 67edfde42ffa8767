"""Operators the three models never use, as the transformers zoo uses them: each program
lowers with every LayerNorm delegated, passes the file's checks and runs in both runtimes
to eager's outputs.

- a fused projection split in parts (`split_with_sizes_copy.out`, whose schema returns
  nothing while the file passes its out list as the return): gpt2, falcon, deberta, ...;
- a batch norm in eval mode (`_native_batch_norm_legit_no_training.out`, whose unused
  statistics the file declares empty): cvt, mobilevit, wav2vec2-conformer, ...;
- a float raised to an int32 constant exponent (`pow.Tensor_Tensor_out`): bloom's ALiBi.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.lowering import lower_and_compare
from support.reference import assert_same_outputs


class SplitProjection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 40)

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).split([16, 16, 8], dim=-1)
        return q * k, v


class ConvBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.ln = nn.LayerNorm(8)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.ln(y.flatten(2).transpose(1, 2))


class IntExponent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.register_buffer("powers", torch.arange(1, 7, dtype=torch.int32))

    def forward(self, x):
        return self.ln(x) * torch.pow(torch.full_like(x, 0.5), self.powers)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


CASES = {
    "split_with_sizes": (SplitProjection, (_randn(2, 5, 16),)),
    "batch_norm_eval": (ConvBatchNorm, (_randn(2, 3, 6, 6),)),
    "int_exponent": (IntExponent, (_randn(3, 6),)),
}


@pytest.mark.parametrize("case", CASES)
def test_zoo_operator_runs_in_both_runtimes(case, native_runtime, tmp_path):
    make, inputs = CASES[case]
    module = make().eval()
    prog = lower_and_compare(module, inputs, layer_norms=1)
    path = tmp_path / f"{case}.pte"
    prog.save(path)
    with torch.no_grad():
        want = module(*inputs)
    # ExecuTorch's runtime returns a list of the outputs
    assert_same_outputs(native_runtime.load(path)(*inputs), list(want) if isinstance(want, tuple) else [want])
