"""Build the native libraries: when the package installs (setup.py), and again at first use
where their sources changed since (an editable checkout); `python -m pipeline.native.build
[--force] [--runtime-only]` by hand.

Compiles pipeline/native/*.cpp with the system C++ compiler against the executorch, wgpu and
dawn-python wheels (the build's requirements, or the environment's without build isolation),
nothing else. Two libraries share the launch code (LayerNormLaunch, the
device, the blob decoder, the configuration rule):
- libpipeline_webgpu.so, the WebGPUBackend for ExecuTorch's runtime: ExecuTorch's runtime
  headers (`executorch/include`), its `_portable_lib` (resize_tensor_impl) and
  `libqnn_executorch_backend.so` (the backend registry and logging), and wgpu's headers
  (`webgpu.h`, `wgpu.h`); it binds to the wgpu-native that wgpu-py has loaded.
- libpipeline_layer_norm.so, the Python runtime's delegate call (pipeline.runtime's
  native_call): wgpu's headers only, no ExecuTorch; it binds to the wgpu-native that
  wgpu-py has loaded, and carries its own C++ runtime (static libstdc++), so it loads on
  any Linux host with the same wgpu wheel (the lent H200 has no ExecuTorch).
With dawn-python installed, the same sources build a second pair for Dawn (PIPELINE_WEBGPU=dawn),
libpipeline_webgpu_dawn.so and libpipeline_layer_norm_dawn.so: Dawn's pre-1.0 C API (Chromium
133's, which dawn-python 0.3.0 ships without a header) as dawn_webgpu.h declares it, generated
from dawn-python's ctypes bindings (dawn_webgpu.py), every call bound by dlsym on dawn-python's
library at run time (WebGPUApi.h); nothing links against it.
What the Python side decides reaches the C++ as headers generated first (generate.py: the
WGSL files and module pieces, the configuration rule's steps, the blob layout), so the C++
kernel is the Python runtime's kernel and reads the blob Python writes.

Output: pipeline/native/lib/ of the installed package (of the checkout, git-ignored, for an
editable install; PIPELINE_NATIVE_BUILD_DIR moves it). No library records where a wheel's
library lies: the two of ExecuTorch's that the backends link are named by their sonames, which
the process has loaded first (`pipeline.native` imports `_portable_lib`), and wgpu-native's calls
come from the process, so a library built in pip's isolated environment loads beside the
wheels wherever they are installed. A stamp per library (hash of sources, generated headers,
flags and wheel versions) skips an up-to-date build.
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
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.ioutil import write_text_atomic
from pipeline.native import dawn_webgpu, generate

# The wheels this build was written and tested against: which of their libraries exports the
# backend registry and which exports resize_tensor_impl is not an API promise.
PINNED_VERSIONS = {"executorch": "1.4.1", "wgpu": "0.32.0"}

SOURCE_DIR = Path(__file__).resolve().parent
# Where the package keeps its libraries (pipeline/native/lib).
LIB_DIR = SOURCE_DIR / "lib"
LIBRARY_NAME = "libpipeline_webgpu.so"
RUNTIME_LIBRARY_NAME = "libpipeline_layer_norm.so"
# The runtime library's sources (the backend takes every other file and not its entry points).
RUNTIME_SOURCES = (
    "HostCopy.cpp", "LayerNormLaunch.cpp", "LayerNormConfig.cpp", "WebGPUApi.cpp", "WebGPUDelegateHeader.cpp",
    "WebGPUDevice.cpp", "CallLibrary.cpp",
)
# The Dawn build: its libraries are these names with DAWN_SUFFIX before ".so".
DAWN_SUFFIX = "_dawn"
DAWN_FLAGS = ("-DPIPELINE_WEBGPU_DAWN",)
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
    wgpu_version: str  # for Dawn: dawn-python's
    includes: tuple[Path, ...]
    libraries: tuple[Path, ...]  # linked by soname: loaded into the process before ours
    dawn: bool = False


def build_dir() -> Path:
    override = os.environ.get(BUILD_DIR_ENV)
    return Path(override) if override else LIB_DIR


def library_name(runtime: bool = False, dawn: bool = False) -> str:
    name = RUNTIME_LIBRARY_NAME if runtime else LIBRARY_NAME
    return name.replace(".so", DAWN_SUFFIX + ".so") if dawn else name


def library_path(dawn: bool = False) -> Path:
    return build_dir() / library_name(dawn=dawn)


def runtime_library_path(dawn: bool = False) -> Path:
    return build_dir() / library_name(runtime=True, dawn=dawn)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"the {name} package is not installed; run scripts/setup.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def find_wheels(executorch: bool = True, dawn: bool = False) -> Wheels:
    """The headers and libraries of the installed executorch and wgpu wheels (wgpu's headers
    alone without `executorch`: the runtime library's build); with `dawn`, none of wgpu's (the
    Dawn declarations are generated; BuildError, in one line, without dawn-python)."""
    if dawn and importlib.util.find_spec("pydawn") is None:
        raise BuildError("dawn-python (package pydawn) is not installed: no Dawn build")
    version, includes, libraries = _executorch_parts() if executorch else ("", (), ())
    if dawn:
        return Wheels(executorch_version=version, wgpu_version=importlib.metadata.version("dawn-python"),
                      includes=includes, libraries=libraries, dawn=True)
    resources = _package_dir("wgpu") / "resources"
    _check_files({"wgpu-native header": resources / "wgpu.h"})
    return Wheels(executorch_version=version, wgpu_version=importlib.metadata.version("wgpu"),
                  includes=(*includes, resources), libraries=libraries)


def _check_files(needed: dict[str, Path]) -> None:
    for what, path in needed.items():
        if not path.is_file():
            raise BuildError(f"{what} not found at {path}; is the wheel the pinned one ({PINNED_VERSIONS})?")


def _executorch_parts() -> tuple[str, tuple[Path, ...], tuple[Path, ...]]:
    """The installed executorch wheel's version, include folders and the libraries the
    backend links (BuildError, in one line, where one is missing)."""
    et = _package_dir("executorch")
    portable = sorted((et / "extension" / "pybindings").glob("_portable_lib*.so"))
    needed = {
        "ExecuTorch runtime headers": et / "include" / "executorch" / "runtime" / "backend" / "interface.h",
        "ExecuTorch _portable_lib": portable[0] if portable else et / "extension" / "pybindings" / "_portable_lib.so",
        "ExecuTorch backend registry library": et / "backends" / "qualcomm" / "libqnn_executorch_backend.so",
    }
    _check_files(needed)
    includes = (et / "include", et / "include" / "executorch" / "runtime" / "core" / "portable_type" / "c10")
    libraries = (needed["ExecuTorch _portable_lib"], needed["ExecuTorch backend registry library"])
    return importlib.metadata.version("executorch"), includes, libraries


def _dawn_header() -> str:
    try:
        return dawn_webgpu.header()
    except dawn_webgpu.DeclarationError as exc:
        raise BuildError(f"{exc} (built for dawn-python 0.3.0)") from exc


def dawn_library() -> Path:
    """dawn-python's libwebgpu_dawn, whose calls the Dawn libraries bind at run time."""
    from pydawn import webgpu

    return Path(webgpu.dll_path)


def version_mismatches(wheels: Wheels) -> list[str]:
    """Installed versions that differ from PINNED_VERSIONS (local tags like +cpu ignored)."""
    found = {"executorch": wheels.executorch_version, "wgpu": wheels.wgpu_version}
    return [
        f"{name} {found[name]} (pinned {pinned})"
        for name, pinned in PINNED_VERSIONS.items()
        if found[name] and found[name].split("+")[0] != pinned
    ]


def _sources(runtime: bool = False) -> list[Path]:
    # WebGPUApi.cpp holds both implementations' differences (the Dawn build defines which).
    if runtime:
        return [SOURCE_DIR / name for name in RUNTIME_SOURCES]
    return [p for p in sorted(SOURCE_DIR.glob("*.cpp")) if p.name != CALL_LIBRARY_SOURCE]


def _fingerprint(compiler: str, wheels: Wheels, generated: dict[str, str], runtime: bool = False) -> str:
    """What a library's bytes follow from: sources, headers, this file, the generated headers,
    the compiler's name, flags and the wheels' versions (not where they are installed)."""
    digest = hashlib.sha256()
    for path in [*_sources(runtime), *sorted(SOURCE_DIR.glob("*.h")), Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for name, text in sorted(generated.items()):
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    versions = (wheels.executorch_version, wheels.wgpu_version)
    digest.update(repr((Path(compiler).name, CXX_FLAGS, versions, runtime, wheels.dawn)).encode())
    return digest.hexdigest()


def compiler_name() -> str:
    return os.environ.get("CXX", "g++")


def find_compiler() -> str:
    compiler = shutil.which(compiler_name())
    if compiler is None:
        raise BuildError("no C++ compiler found (install g++ or set CXX)")
    return compiler


def build(force: bool = False, log=None, runtime: bool = False, dawn: bool = False,
          out_dir: Path | None = None) -> Path:
    """Build the backend library (`runtime`: the Python runtime's call library; `dawn`: its
    Dawn build) into `out_dir` (default build_dir()) if sources, generated headers, flags or
    wheels changed; return its path. An up-to-date library needs no compiler."""
    wheels = find_wheels(executorch=not runtime, dawn=dawn)
    generated = generate.headers()
    if dawn:
        generated[dawn_webgpu.HEADER_NAME] = _dawn_header()
    out_dir = build_dir() if out_dir is None else out_dir
    name = library_name(runtime, dawn)
    suffix = DAWN_SUFFIX.replace("_", "-") if dawn else ""
    what = ("runtime call library" if runtime else "native backend") + (" for Dawn" if dawn else "")
    library = out_dir / name
    stamp = out_dir / (("stamp-runtime" if runtime else "stamp") + suffix)
    fingerprint = _fingerprint(compiler_name(), wheels, generated, runtime)
    if not force and library.is_file() and stamp.is_file() and stamp.read_text() == fingerprint:
        if log is not None:
            log(f"{what}: {library} is up to date")
        return library

    compiler = find_compiler()
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-native-") as scratch:
        _compile_and_link(compiler, wheels, generated, Path(scratch), out_dir / name, runtime, dawn)
    write_text_atomic(stamp, fingerprint)  # builds at once (test workers, census rows) each replace whole files
    if log is not None:
        log(f"{what}: built {library} in {time.monotonic() - started:.1f} s")
    return library


def _compile_and_link(compiler: str, wheels: Wheels, generated: dict[str, str], scratch: Path, library: Path,
                      runtime: bool, dawn: bool) -> None:
    """The library's objects and generated headers in `scratch`, the library itself at `library`
    (complete or absent)."""
    gen = scratch / "gen"
    objects = scratch / "obj"
    gen.mkdir()
    objects.mkdir()
    for name, text in generated.items():
        (gen / name).write_text(text)
    includes = [f"-I{p}" for p in (SOURCE_DIR, gen, *wheels.includes)]
    flags = [*CXX_FLAGS, *(DAWN_FLAGS if dawn else ())]

    def compile_one(source: Path) -> Path:
        target = objects / (source.stem + ".o")
        _run([compiler, *flags, *includes, "-c", str(source), "-o", str(target)])
        return target

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        compiled = list(pool.map(compile_one, _sources(runtime)))

    if runtime:
        link = [*RUNTIME_LINK_FLAGS, "-pthread"]
    else:
        # wgpu-native's calls come from the process (undefined here); Dawn's are bound by dlsym.
        link = ["-Wl,--no-undefined"] if dawn else []
        for lib in wheels.libraries:
            link += [f"-L{lib.parent}", f"-l:{lib.name}"]
    if dawn:
        link.append("-ldl")
    partial = library.with_name(f"{library.name}.{os.getpid()}.tmp")
    _run([compiler, "-shared", "-o", str(partial), *map(str, compiled), *link])
    os.replace(partial, library)


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
    try:
        build(force=args.force, log=log, runtime=True, dawn=True)
        if not args.runtime_only:
            build(force=args.force, log=log, dawn=True)
    except BuildError as exc:
        log(f"native build for Dawn skipped: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
