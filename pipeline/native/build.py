"""Build the native libraries: `python -m pipeline.native.build [--force] [--runtime-only]`.

Compiles pipeline/native/*.cpp with the system C++ compiler against what `pip install`
put on disk, nothing else. Two libraries share the launch code (LayerNormLaunch, the
device, the blob decoder, the configuration rule):
- libpipeline_webgpu.so, the WebGPUBackend for ExecuTorch's runtime: ExecuTorch's runtime
  headers (`executorch/include`), its `_portable_lib` (resize_tensor_impl) and
  `libqnn_executorch_backend.so` (the backend registry and logging), and wgpu's bundled
  wgpu-native (`webgpu.h`, `wgpu.h`, `libwgpu_native-release.so`).
- libpipeline_layer_norm.so, the Python runtime's delegate call (pipeline.runtime's
  native_call): wgpu's headers only, no ExecuTorch; it binds to the wgpu-native that
  wgpu-py has loaded, and carries its own C++ runtime (static libstdc++), so it loads on
  any Linux host with the same wgpu wheel (the lent H200 has no ExecuTorch).
The WGSL files of pipeline/wgsl/ are embedded into a generated header, so the C++ kernel
is the Python runtime's kernel.

Output: build/native/ (git-ignored; PIPELINE_NATIVE_BUILD_DIR moves it). A stamp per
library (hash of sources, WGSL, flags and wheel versions) skips an up-to-date build.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline import wgsl

# The wheels this build was written and tested against (RUNTIME_NOTES, issue 12): which
# library exports the registry and which exports resize_tensor_impl is not an API promise.
PINNED_VERSIONS = {"executorch": "1.4.1", "wgpu": "0.32.0"}

SOURCE_DIR = Path(__file__).resolve().parent
WGSL_DIR = SOURCE_DIR.parent / "wgsl"
# The kernel files the backend embeds (pipeline/wgsl/ also holds benchmark-only shaders).
WGSL_FILES = (
    "native_layer_norm.wgsl", "reduce_subgroup.wgsl", "reduce_workgroup.wgsl", "subgroup_size.wgsl", "f16_pack_probe.wgsl",
    "storage_float32.wgsl", "storage_half.wgsl", "storage_half_odd.wgsl", "half.wgsl",
)
LIBRARY_NAME = "libpipeline_webgpu.so"
RUNTIME_LIBRARY_NAME = "libpipeline_layer_norm.so"
# The runtime library's sources (the backend takes every other file and not its entry points).
RUNTIME_SOURCES = (
    "HostCopy.cpp", "LayerNormLaunch.cpp", "LayerNormConfig.cpp", "WebGPUDelegateHeader.cpp",
    "WebGPUDevice.cpp", "CallLibrary.cpp",
)
CALL_LIBRARY_SOURCE = "CallLibrary.cpp"
# The runtime library brings its own C++ runtime; wgpu-native's symbols come from the process.
RUNTIME_LINK_FLAGS = ("-static-libstdc++", "-static-libgcc", "-Wl,--exclude-libs,ALL")
BUILD_DIR_ENV = "PIPELINE_NATIVE_BUILD_DIR"
CXX_FLAGS = (
    "-std=c++17", "-O2", "-fPIC", "-Wall", "-Wno-unused-parameter",
    "-fvisibility=hidden", "-fvisibility-inlines-hidden",
    # As ExecuTorch's own wheel build compiles its runtime headers.
    "-DC10_USING_CUSTOM_GENERATED_MACROS",
)


class BuildError(RuntimeError):
    """The native backend cannot be built here; the message says why and what to do."""


@dataclass(frozen=True)
class Wheels:
    """Where the installed wheels keep what the build needs."""

    executorch_version: str
    wgpu_version: str
    includes: tuple[Path, ...]
    libraries: tuple[Path, ...]  # linked by file name, found at run time through rpath


def build_dir() -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    return Path(override) if override else SOURCE_DIR.parents[1] / "build" / "native"


def library_path() -> Path:
    return build_dir() / LIBRARY_NAME


def runtime_library_path() -> Path:
    return build_dir() / RUNTIME_LIBRARY_NAME


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"the {name} package is not installed; run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def find_wheels(executorch: bool = True) -> Wheels:
    """The headers and libraries of the installed executorch and wgpu wheels (wgpu's
    alone without `executorch`: the runtime library's build)."""
    wgpu_dir = _package_dir("wgpu")
    if not executorch:
        header = wgpu_dir / "resources" / "wgpu.h"
        if not header.is_file():
            raise BuildError(f"wgpu-native header not found at {header}; is the wheel the pinned one "
                             f"({PINNED_VERSIONS})?")
        return Wheels(executorch_version="", wgpu_version=importlib.metadata.version("wgpu"),
                      includes=(wgpu_dir / "resources",), libraries=())
    et = _package_dir("executorch")
    portable = sorted((et / "extension" / "pybindings").glob("_portable_lib*.so"))
    needed = {
        "ExecuTorch runtime headers": et / "include" / "executorch" / "runtime" / "backend" / "interface.h",
        "ExecuTorch _portable_lib": portable[0] if portable else et / "extension" / "pybindings" / "_portable_lib.so",
        "ExecuTorch backend registry library": et / "backends" / "qualcomm" / "libqnn_executorch_backend.so",
        "wgpu-native header": wgpu_dir / "resources" / "wgpu.h",
        "wgpu-native library": wgpu_dir / "resources" / "libwgpu_native-release.so",
    }
    for what, path in needed.items():
        if not path.is_file():
            raise BuildError(f"{what} not found at {path}; is the wheel the pinned one ({PINNED_VERSIONS})?")
    return Wheels(
        executorch_version=importlib.metadata.version("executorch"),
        wgpu_version=importlib.metadata.version("wgpu"),
        includes=(
            et / "include",
            et / "include" / "executorch" / "runtime" / "core" / "portable_type" / "c10",
            wgpu_dir / "resources",
        ),
        libraries=(
            needed["ExecuTorch _portable_lib"],
            needed["ExecuTorch backend registry library"],
            needed["wgpu-native library"],
        ),
    )


def version_mismatches(wheels: Wheels) -> list[str]:
    """Installed versions that differ from PINNED_VERSIONS (local tags like +cpu ignored)."""
    found = {"executorch": wheels.executorch_version, "wgpu": wheels.wgpu_version}
    return [
        f"{name} {found[name]} (pinned {pinned})"
        for name, pinned in PINNED_VERSIONS.items()
        if found[name] and found[name].split("+")[0] != pinned
    ]


def wgsl_header() -> str:
    """wgsl_sources.h: each embedded kernel file as the Python runtime reads it (text mode,
    universal newlines), its UTF-8 bytes as octal escapes."""
    entries = []
    for name in WGSL_FILES:
        data = (WGSL_DIR / name).read_text().encode("utf-8")
        escaped = "".join(f"\\{b:03o}" for b in data)
        lines = [escaped[i : i + 96] for i in range(0, len(escaped), 96)] or [""]
        literal = "\n".join(f'        "{line}"' for line in lines)
        entries.append(f'    {{"{name}",\n{literal},\n        {len(data)}}},')
    return (
        "// Generated by pipeline/native/build.py from pipeline/wgsl/; do not edit.\n"
        "#pragma once\n#include <cstddef>\n#include <cstdint>\n\n"
        "struct EmbeddedWgsl {\n  const char* name;\n  const char* text;\n  size_t size;\n};\n\n"
        "static const EmbeddedWgsl kEmbeddedWgsl[] = {\n" + "\n".join(entries) + "\n};\n\n"
        + _f16_pack_cases()
    )


def _f16_pack_cases() -> str:
    """The float16 pack probe's values (float32 bits) and their aten rounding (float16 bits),
    the very cases the Python runtime's probe checks (`pipeline.wgsl.f16_pack_cases`)."""
    import numpy as np

    values = wgsl.f16_pack_cases()
    want = wgsl.aten_f16_bits(values)

    def table(kind: str, name: str, items) -> str:
        body = ",".join(f"0x{int(v):x}" for v in items)
        return f"static const {kind} {name}[] = {{{body}}};\n"

    return (table("uint32_t", "kF16PackCaseBits", values.view(np.uint32))
            + table("uint16_t", "kF16PackExpected", want)
            + f"static const size_t kF16PackCases = {values.size};\n")


def _sources(runtime: bool = False) -> list[Path]:
    if runtime:
        return [SOURCE_DIR / name for name in RUNTIME_SOURCES]
    return [p for p in sorted(SOURCE_DIR.glob("*.cpp")) if p.name != CALL_LIBRARY_SOURCE]


def _fingerprint(compiler: str, wheels: Wheels, header: str, runtime: bool = False) -> str:
    """What a library's bytes follow from: sources, headers, this file, the WGSL header, the
    compiler's name, flags and the wheels' versions (not where they are installed)."""
    digest = hashlib.sha256()
    for path in [*_sources(runtime), *sorted(SOURCE_DIR.glob("*.h")), Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(header.encode())
    versions = (wheels.executorch_version, wheels.wgpu_version)
    digest.update(repr((Path(compiler).name, CXX_FLAGS, versions, runtime)).encode())
    return digest.hexdigest()


def compiler_name() -> str:
    return os.environ.get("CXX", "g++")


def find_compiler() -> str:
    compiler = shutil.which(compiler_name())
    if compiler is None:
        raise BuildError("no C++ compiler found (install g++ or set CXX)")
    return compiler


def build(force: bool = False, log=None, runtime: bool = False) -> Path:
    """Build the backend library (`runtime`: the Python runtime's call library) if
    sources, WGSL, flags or wheels changed; return its path. An up-to-date library needs
    no compiler."""
    wheels = find_wheels(executorch=not runtime)
    header = wgsl_header()
    out_dir = build_dir()
    name = RUNTIME_LIBRARY_NAME if runtime else LIBRARY_NAME
    what = "runtime call library" if runtime else "native backend"
    library = out_dir / name
    stamp = out_dir / ("stamp-runtime" if runtime else "stamp")
    fingerprint = _fingerprint(compiler_name(), wheels, header, runtime)
    if not force and library.is_file() and stamp.is_file() and stamp.read_text() == fingerprint:
        if log is not None:
            log(f"{what}: {library} is up to date")
        return library

    compiler = find_compiler()
    started = time.monotonic()
    gen = out_dir / "gen"
    objects = out_dir / ("obj-runtime" if runtime else "obj")
    gen.mkdir(parents=True, exist_ok=True)
    objects.mkdir(parents=True, exist_ok=True)
    _write_atomically(gen / "wgsl_sources.h", header)
    includes = [f"-I{p}" for p in (SOURCE_DIR, gen, *wheels.includes)]

    def compile_one(source: Path) -> Path:
        target = objects / (source.stem + ".o")
        _run([compiler, *CXX_FLAGS, *includes, "-c", str(source), "-o", str(target)])
        return target

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        compiled = list(pool.map(compile_one, _sources(runtime)))

    if runtime:
        link = [*RUNTIME_LINK_FLAGS, "-pthread"]
    else:
        link = ["-Wl,--no-undefined"]
        for lib in wheels.libraries:
            link += [f"-L{lib.parent}", f"-l:{lib.name}", f"-Wl,-rpath,{lib.parent}"]
    partial = out_dir / (name + ".tmp")
    _run([compiler, "-shared", "-o", str(partial), *map(str, compiled), *link])
    os.replace(partial, library)
    stamp.write_text(fingerprint)
    if log is not None:
        log(f"{what}: built {library} in {time.monotonic() - started:.1f} s")
    return library


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + f".{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, path)


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"`{' '.join(command[:1] + command[-3:])}` failed:\n{result.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.native.build", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--runtime-only", action="store_true",
                        help="only the Python runtime's call library (needs wgpu, not ExecuTorch)")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        mismatches = version_mismatches(find_wheels(executorch=not args.runtime_only))
        if mismatches:
            log(f"native build: warning: built for other wheels than installed: {', '.join(mismatches)}")
        build(force=args.force, log=log, runtime=True)
        if not args.runtime_only:
            build(force=args.force, log=log)
    except BuildError as exc:
        log(f"native backend: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
