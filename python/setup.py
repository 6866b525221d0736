"""Builds libmeshkern with the project's CMake and bundles it, with the public header the
binding's cdef is generated from, inside the wheel (meshkern/_lib/libmeshkern.so,
meshkern/meshkern.h).

Environment (build time):
  MESHKERN_LIB          bundle this already-built libmeshkern.so instead of building one
  MESHKERN_BUILD_DIR    CMake build directory (default: <repo>/build-python)
  MESHKERN_CMAKE_ARGS   extra CMake arguments, e.g. "-DMESHKERN_CUDA=OFF"

The library links the system's OpenBLAS, protobuf-c, OpenSSL, PCRE2 and Open MPI
(scripts/deps.sh installs them); they are not bundled.
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _build_library() -> Path:
    given = os.environ.get("MESHKERN_LIB")
    if given:
        return Path(given).resolve()
    if not (ROOT / "CMakeLists.txt").is_file():
        raise RuntimeError("meshkern: the project's CMakeLists.txt is not beside python/ (set MESHKERN_LIB)")
    build = Path(os.environ.get("MESHKERN_BUILD_DIR", ROOT / "build-python"))
    args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DMESHKERN_TESTS=OFF",
            "-DMESHKERN_RELOCATABLE=ON"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"] if not (build / "CMakeCache.txt").exists() else []
    args += shlex.split(os.environ.get("MESHKERN_CMAKE_ARGS", ""))
    subprocess.check_call(args)
    subprocess.check_call(["cmake", "--build", str(build), "--target", "meshkern"])
    return (build / "host" / "libmeshkern.so").resolve()


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        pkg = Path(self.build_lib) / "meshkern"
        (pkg / "_lib").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "include" / "meshkern.h" if (ROOT / "include").is_dir() else HERE / "meshkern" /
                        "meshkern.h", pkg / "meshkern.h")
        lib = _build_library()
        shutil.copyfile(lib, pkg / "_lib" / "libmeshkern.so")
        os.chmod(pkg / "_lib" / "libmeshkern.so", 0o755)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: platform-specific, not pure."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
