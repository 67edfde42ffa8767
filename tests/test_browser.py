"""The kernel in a real browser: page.html on headless Chromium's own WebGPU
(`navigator.gpu`; without a GPU, SwiftShader's Vulkan through Dawn), on both reduction
paths, held against float64 with eager as the yardstick, NaN and infinite rows like aten.

One Chromium for the module, every launch in one evaluation. Without Chromium, or with a
browser whose WebGPU has no adapter or no subgroups, the tests skip with the reason;
under PIPELINE_REQUIRE_GPU=1 (CI) they fail instead.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest
import torch

from pipeline.browser import BrowserError, BrowserKernel, Launch, Outcome, find_chromium, open_browser_kernel
from pipeline.browser.page import float64_reference
from support.gpu import REQUIRE_GPU_ENV
from support.grids import AFFINE

ATEN = torch.ops.aten.native_layer_norm.default
PATHS = ["subgroup", "workgroup"]
# x's dtype and weight/bias's (None: x's).
DTYPES = [(torch.float32, None), (torch.float16, None), (torch.float16, torch.float32), (torch.bfloat16, None)]
# Rows held by one thread (scalar loads); by 2 and by 4 threads (vec2, vec4), within one
# subgroup where subgroups have 4 lanes or more (the butterfly alone, no barrier); by several
# subgroups (vec4 and scalar loads); streamed (wider than 8 values x 256 threads).
BROWSER_WIDTHS = [7, 22, 64, 384, 1023, 4097]
ROWS = ["random", "hard"]


def widths_of(path: str, dtypes: tuple) -> list[int]:
    """float32 and float16 at every width on both paths; the other two pairs at every width on
    one path or the other, alternating (each module costs ~0.4 s to compile on SwiftShader)."""
    p, d = PATHS.index(path), DTYPES.index(dtypes)
    return [width for w, width in enumerate(BROWSER_WIDTHS) if d < 2 or (p + d + w) % 2 == 0]


CASES = [(path, dtype, affine_dtype, width, rows) for path in PATHS for dtype, affine_dtype in DTYPES
         for width in widths_of(path, (dtype, affine_dtype)) for rows in ROWS]
# Large mean, small spread: float32's and, coarser, the half dtypes' (their ulp at the mean).
SHIFTED = {torch.float32: (1e4, 1e-2), torch.float16: (1e3, 1.0), torch.bfloat16: (1e3, 30.0)}


def case_id(case) -> str:
    path, dtype, affine_dtype, width, rows = case
    dtypes = str(dtype).removeprefix("torch.") + ("" if affine_dtype is None else "-affine_float32")
    return f"{path}-{dtypes}-{width}-{rows}"


def make_launch(case) -> Launch:
    """The case's rows, weight and bias (seeded); its affine variant and whether it stores
    mean and rstd rotate over its widths, so that each dtype pair meets them all."""
    path, dtype, affine_dtype, width, rows = case
    turn = (widths_of(path, (dtype, affine_dtype)).index(width) + DTYPES.index((dtype, affine_dtype))
            + PATHS.index(path))
    has_weight, has_bias = AFFINE[turn % 4]
    gen = torch.Generator().manual_seed(width * 7 + turn)
    if rows == "random":
        x = torch.randn(6, width, generator=gen) * 2 + 0.5
    else:
        loc, spread = SHIFTED[dtype]
        x = torch.randn(7, width, generator=gen)
        x[0] = loc + spread * x[0]
        x[1] = -3.25
        x[2, width // 2] = float("nan")
        x[3, 0] = float("inf")
        x[4, -1] = float("-inf")
        x[5, 0], x[5, -1] = float("inf"), float("-inf")
    affine = affine_dtype or dtype
    weight = torch.randn(width, generator=gen).to(affine) if has_weight else None
    bias = torch.randn(width, generator=gen).to(affine) if has_bias else None
    return Launch(x.to(dtype), weight, bias, subgroups=path == "subgroup", write_stats=turn % 3 != 2,
                  label=case_id(case))


def unavailable(reason: str):
    """Skip for `reason`; under PIPELINE_REQUIRE_GPU=1 (CI) fail instead."""
    if os.environ.get(REQUIRE_GPU_ENV) == "1":
        pytest.fail(f"{REQUIRE_GPU_ENV}=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    """The page in one headless Chromium for the module, its device made and probed."""
    executable = find_chromium()
    if executable is None:
        unavailable("no Chromium to run the browser check (Debian's chromium; or set PIPELINE_CHROMIUM)")
    with contextlib.ExitStack() as stack:
        try:
            kernel = stack.enter_context(open_browser_kernel(executable))
        except BrowserError as exc:
            unavailable(f"the browser's WebGPU is not usable: {exc}")
        if not kernel.subgroup_size:
            unavailable(f"the browser's adapter ({kernel.adapter['architecture']}, features "
                        f"{kernel.adapter['features']}) has no subgroups, so one reduction path would go untested")
        yield kernel


@pytest.fixture(scope="module")
def outcomes(browser: BrowserKernel) -> dict[str, Outcome]:
    launches = [make_launch(case) for case in CASES]
    return {launch.label: outcome for launch, outcome in zip(launches, browser.run(launches))}


def test_the_browser_adapter_has_subgroups(browser):
    assert browser.adapter["subgroups"] and browser.subgroup_size & (browser.subgroup_size - 1) == 0
    # The probe's size lies within the range the adapter reports (where it reports one).
    if browser.adapter["subgroupMinSize"]:
        assert browser.adapter["subgroupMinSize"] <= browser.subgroup_size <= browser.adapter["subgroupMaxSize"]


def check_against_float64(outcome: Outcome) -> dict[str, float]:
    """aten's dtypes and shapes, aten's NaN/infinity pattern, and the error against float64
    bounded by eager's at the same dtype: float32 by 4x eager float32's plus a floor of a few
    ulp of the value (out: and of one float32 ulp of the row's mean carried through rstd and
    weight); a half dtype by 1.25x eager's, which rounds once as the kernel does (mean and
    rstd may sit one half ulp the other side of a tie). Returns the errors."""
    launch = outcome.launch
    x, width = launch.x, launch.x.shape[-1]
    eager = ATEN(x, [width], launch.weight, launch.bias, launch.eps)
    truth = float64_reference(launch)
    half = x.dtype != torch.float32
    ours = (outcome.out, outcome.mean, outcome.rstd)
    mean_ulp = np.spacing(truth[1].float().abs().numpy()).astype(np.float64) * truth[2].numpy()
    gain = 1.0 if launch.weight is None else max(1.0, launch.weight.abs().max().item())
    finite_rows = np.isfinite(mean_ulp)
    mean_floor = float(mean_ulp[finite_rows].max()) * gain if finite_rows.any() else 0.0
    errors = {}
    for name, o, e, t in zip(("out", "mean", "rstd"), ours, eager, truth):
        if o is None:
            assert name != "out" and not launch.write_stats
            continue
        assert o.dtype == e.dtype and o.shape == e.shape, (
            f"{name}: {o.dtype} {list(o.shape)}, aten's {e.dtype} {list(e.shape)}")
        # A row with an infinity has a mean of +-inf or NaN depending on where it sits (in
        # aten too): the kernel must agree on which statistics are finite and which outputs NaN.
        same = torch.isnan if name == "out" else torch.isfinite
        assert torch.equal(same(o), same(e)), f"{name}: non-finite pattern differs from aten's"
        finite = torch.isfinite(t) & torch.isfinite(e)
        if not finite.any():
            continue
        err = (o.double() - t)[finite].abs().max().item()
        eager_err = (e.double() - t)[finite].abs().max().item()
        scale = t[finite].abs().max().item()
        if half:
            bound = 1.25 * eager_err + (0.0 if name == "out" else torch.finfo(o.dtype).eps * scale)
        else:
            floor = 8 * np.finfo(np.float32).eps * max(scale, 1.0) + (mean_floor if name == "out" else 0.0)
            bound = 4 * eager_err + floor
        assert err <= bound, f"{name}: error {err:.3g} vs float64, eager {eager_err:.3g} (bound {bound:.3g})"
        errors[name] = err
    return errors


# Known to miss the bound, with why. On 4-lane subgroups (SwiftShader: Chromium, Dawn; wgpu
# does the same when given 4) a streamed float32 row at 1e4 with a spread of 1e-2 gets a mean
# about 2 float32 ulp off (20 seeds: 2.0 on average, 2.3 at most; eager 1.2 at most, the
# workgroup-memory path 0.8 on average), and out 12x eager's error. The row mean is the sum
# of 256 per-thread terms, and each lane adds 256 / 4 / 4 = 16 subgroup parts one after
# another: with 8 lanes (4 parts each) the mean is 0.8 ulp off, as the tree's; forced to 2
# lanes 2.3, to 1 lane (256 parts in sequence) 30 (wgpu on lavapipe, same rows).
# (case, subgroup size): why a case is expected to fail; none since a row's subgroup parts
# are summed as a tree (on 4 lanes the streamed float32 4097-wide row at 1e4 was ~2 ulp off).
KNOWN_MISSES: dict[tuple[str, int], str] = {}


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_kernel_in_the_browser_matches_float64(request, browser, outcomes, case):
    known = KNOWN_MISSES.get((case_id(case), browser.subgroup_size))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))
    outcome = outcomes[case_id(case)]
    assert outcome.error is None, outcome.error
    assert not outcome.warnings, f"Chromium's compiler warned: {outcome.warnings}"
    assert outcome.config.subgroup_size == (browser.subgroup_size if case[0] == "subgroup" else 0)
    errors = check_against_float64(outcome)
    # The page's own comparison with the float64 values it was sent sees the same outputs.
    page = outcome.checks["out"]
    assert page["nanMismatches"] == 0
    assert page["maxError"] == pytest.approx(errors.get("out", 0.0), rel=1e-12, abs=0)


def test_rows_with_nan_or_infinity_come_out_nan(outcomes):
    for case in CASES:
        if case[-1] != "hard":
            continue
        out = outcomes[case_id(case)].out
        assert torch.isnan(out[2:6]).all(), case_id(case)
        assert torch.isfinite(out[[0, 1, 6]]).all(), case_id(case)


def test_a_refused_module_reports_the_compilers_message(browser):
    # The subgroup module without its `enable subgroups;` directive: Tint (Chromium's
    # compiler) refuses it, and the message comes back with the launch.
    launch = make_launch(("subgroup", torch.float32, None, 384, "random"))
    request = browser.request(launch)
    request["module"] = request["module"].replace("enable subgroups;\n", "")
    request["label"] = "without enable"
    answer = browser.page.evaluate(f"nativeLayerNorm.run([{json.dumps(request)}])")
    error = answer["results"][0]["error"]
    assert "compiling without enable" in error and "subgroups" in error, error


def test_a_validation_error_reports_the_message(browser):
    # x bound as a uniform buffer where the module declares storage: the pipeline is refused.
    launch = make_launch(("workgroup", torch.float32, None, 7, "random"))
    request = browser.request(launch)
    request["bindings"] = ["uniform", *request["bindings"][1:]]
    request["label"] = "x as uniform"
    answer = browser.page.evaluate(f"nativeLayerNorm.run([{json.dumps(request)}])")
    error = answer["results"][0]["error"]
    assert "pipeline of x as uniform" in error, error
