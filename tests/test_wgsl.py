"""One WGSL source, valid for both compilers: every module the runtime generates (the
kernel over its whole configuration grid, the device probes, the benchmark's copy) compiles
under naga (wgpu) and Tint (Dawn) with no error and no warning. The C++ backend's modules
are these byte for byte (tests/test_native.py), for both compilers."""

from __future__ import annotations

import itertools
import os

import pytest

from pipeline.runtime import device as runtime_device
from pipeline.wgsl import ShaderFiles
from pipeline.wgsl.config import choose_config
from support.gpu import REQUIRE_GPU_ENV
from support.grids import DTYPE_PAIRS

pytestmark = pytest.mark.usefixtures("gpu_info")

COMPILERS = {"naga": "wgpu", "tint": "dawn"}
# Scalar, vec2 and vec4 loads; rows held by one thread, one subgroup or several; rows
# streamed; 768 and 1024 split into 4 vec4 loads a thread, which a large launch doubles.
COMPILED_WIDTHS = [1, 7, 6, 384, 768, 1023, 1024, 4097, 4098, 100_000]
SUBGROUP_SIZES = [0, 4, 8, 32, 128]  # 0: the workgroup-memory path; the smallest, two common, the largest size
PROBES = [("subgroup_size.wgsl", True), ("f16_pack_probe.wgsl", False), ("bench_copy.wgsl", False)]


@pytest.fixture(scope="module")
def compilers() -> dict[str, runtime_device.Gpu]:
    """Each compiler's device: naga's through wgpu, Tint's through Dawn."""
    devices = {}
    for compiler, implementation in COMPILERS.items():
        with pytest.MonkeyPatch.context() as m:
            m.setenv(runtime_device.IMPLEMENTATION_ENV, implementation)
            try:
                devices[compiler] = runtime_device.gpu()
            except RuntimeError as exc:
                if os.environ.get(REQUIRE_GPU_ENV) == "1":
                    raise
                pytest.skip(f"no {implementation} adapter: {exc}")
        assert devices[compiler].impl.compiler == compiler
    return devices


def kernel_modules(compiler: str) -> dict[str, str]:
    """Every distinct kernel module of the grid, by a description of its configuration:
    dtypes x widths x affine x mean/rstd stored x subgroup sizes x float16 store path,
    by width alone and for a launch large enough to double the threads."""
    files = ShaderFiles(compiler)
    modules: dict[str, str] = {}
    for (dtype, affine), width, (weight, bias), stats, subgroups in itertools.product(
            DTYPE_PAIRS, COMPILED_WIDTHS, itertools.product((False, True), repeat=2), (False, True), SUBGROUP_SIZES):
        for pack in (False, True) if dtype == "float16" else (False,):
            for rows in (0, 1 << 20) if width in (768, 1024) else (0,):
                config = choose_config(width, weight, bias, subgroups, dtype, affine, pack, rows=rows,
                                       write_stats=stats)
                modules.setdefault(config.source(files), str(config))
    return {description: source for source, description in modules.items()}


@pytest.mark.parametrize("compiler", list(COMPILERS))
def test_every_kernel_module_compiles_cleanly(compilers, compiler):
    modules = kernel_modules(compiler)
    assert len(modules) > 1000
    failures = {}
    for description, source in modules.items():
        messages = compilers[compiler].impl.compile_messages(source)
        if messages:
            failures[description] = messages
    assert not failures, (f"{len(failures)} of {len(modules)} modules drew messages from {compiler}, e.g. "
                          f"{next(iter(failures.items()))}")


@pytest.mark.parametrize("compiler", list(COMPILERS))
@pytest.mark.parametrize("probe, subgroups", PROBES)
def test_probe_and_benchmark_modules_compile_cleanly(compilers, compiler, probe, subgroups):
    files = ShaderFiles(compiler)
    assert compilers[compiler].impl.compile_messages(files.module(files.shader_source(probe), subgroups)) == []


def test_the_enable_directive_is_written_for_tint_only():
    config = choose_config(768, True, True, 32)
    assert ShaderFiles("tint").module("", True) == "enable subgroups;\n"
    assert config.source(ShaderFiles("tint")).startswith("enable subgroups;\n")
    directives = lambda source: [line for line in source.splitlines() if line.startswith("enable")]  # noqa: E731
    assert directives(config.source(ShaderFiles("tint"))) == ["enable subgroups;"]
    assert directives(config.source(ShaderFiles("naga"))) == []
    assert directives(choose_config(768, True, True, 0).source(ShaderFiles("tint"))) == []


# The checks above can fail: each compiler reports what it refuses.
NONUNIFORM_SHUFFLE = """enable subgroups;
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) tid: u32) {
    if (data[tid] > 0.0) { data[tid] = subgroupShuffleXor(data[tid], 1u); }
}
"""


def test_tint_reports_a_shuffle_in_nonuniform_control_flow(compilers):
    messages = compilers["tint"].impl.compile_messages(NONUNIFORM_SHUFFLE)
    assert any("uniform" in m for m in messages), messages


def test_naga_reports_the_directive_it_does_not_take(compilers):
    assert compilers["naga"].impl.compile_messages(NONUNIFORM_SHUFFLE)
