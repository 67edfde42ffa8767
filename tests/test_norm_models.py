"""Every norm of a transformer on the kernel: each RMSNorm form export gives a model in one
delegate of its own. Errors are held against float64 with eager at the same dtype as the
yardstick: at most twice eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import pipeline
from pipeline.aot.passes import RMS_NORM
from pipeline.blob import CONSTANT
from pipeline.evaluation import evaluate_accuracy

pytestmark = pytest.mark.usefixtures("gpu_info")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# Each RMSNorm form in one delegate of its own

WIDTH = 24


class FunctionalRMSNorm(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, [WIDTH], self.weight, self.eps)


class NormsBetweenLinears(nn.Module):
    """F.rms_norm (aten.rms_norm), nn.RMSNorm, and LlamaRMSNorm (Hugging Face's chain and
    its casts), each between two Linears and told apart by its eps."""

    EPS = (1e-5, 1e-6, 1e-7)

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(WIDTH, WIDTH)
        functional, module, llama = self.EPS
        self.norms = nn.ModuleList([FunctionalRMSNorm(functional), nn.RMSNorm(WIDTH, eps=module),
                                    LlamaRMSNorm(WIDTH, eps=llama)])
        self.linears = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in self.norms)
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.normal_()

    def forward(self, x):
        x = self.first(x)
        outputs = []
        for norm, linear in zip(self.norms, self.linears):
            x = linear(norm(x))
            outputs.append(x)
        return tuple(outputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_rms_norm_form_is_one_delegate_between_cpu_ops(dtype):
    torch.manual_seed(0)
    module = NormsBetweenLinears().to(dtype).eval()
    x = (torch.randn(2, 5, WIDTH) * 3).to(dtype)
    program = pipeline.lower(module, (x,))
    assert program.coverage.kinds == {RMS_NORM: {"total": 3, "delegated": 3}} and program.coverage.complete
    assert [d.params.op for d in program.delegates] == ["rms_norm"] * 3
    assert [d.params.eps for d in program.delegates] == pytest.approx(NormsBetweenLinears.EPS, rel=1e-6)
    assert all(d.params.weight.source == CONSTANT for d in program.delegates)
    # One delegate per norm, a Linear on each side, no piece of a norm (its statistics, its
    # casts, its weight's multiply) left on the CPU.
    steps = program.step_labels
    between = " ".join(steps).split("delegate")
    assert len(between) == 4 and all("aten::addmm.out" in ops for ops in between), steps
    assert set(steps) <= {"delegate", "aten::addmm.out", "aten::view_copy.out"}, steps
    report = evaluate_accuracy(module, (x,), program)
    assert report.passed, report.as_dict()["accuracy"]
