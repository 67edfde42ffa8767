"""setuptools' build of the package, with its native libraries compiled as it builds.

`pip install .` compiles pipeline/native/*.cpp (pipeline.native.build) with the system C++
compiler against the executorch, wgpu and dawn-python wheels that the build requires, into the
wheel's pipeline/native/lib/; an editable install (`pip install --no-build-isolation -e .`, as
scripts/setup.sh runs it) compiles them into the checkout's. Without a compiler the install
fails, saying so.
"""

import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithNative(build_py):
    """build_py, then the four native libraries: the ExecuTorch backend and the Python runtime's
    call library, for wgpu-native and for Dawn."""

    def run(self):
        super().run()
        sys.path.insert(0, str(ROOT))
        from pipeline.native import build

        out_dir = build.LIB_DIR if self.editable_mode else Path(self.build_lib) / "pipeline" / "native" / "lib"
        try:
            for dawn in (False, True):
                for runtime in (True, False):
                    build.build(log=print, runtime=runtime, dawn=dawn, out_dir=out_dir)
        except build.BuildError as exc:
            sys.exit(f"pipeline's native libraries: {exc}")


class WithNativeLibraries(Distribution):
    """A wheel holding native libraries: tagged for its platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithNative}, distclass=WithNativeLibraries)
