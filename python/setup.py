"""Builds the extension module idem._idem with the project's CMake build (the library's
static libraries and every store whose dependencies are installed), then packages it with
the pure-Python files. docs/python.md, "Installing".

Progress: every stage prints a line starting "idem:", and CMake and Ninja print one line per
step ("[12/56] Building CXX object ..."). pip shows them as they come with
`pip install -v`; without -v it shows only "Building wheel for idem ... still running" until
the end (it keeps a build backend's output to itself unless the build fails).

Environment:
  IDEM_CMAKE_BUILD_DIR  reuse a configured build tree of this repository (its
                        python/idem/_idem*.so) instead of configuring one in build/
  IDEM_CMAKE_ARGS       extra arguments for the CMake configure step
                        (e.g. "-DIDEM_WITH_REDIS=OFF")
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def say(message: str) -> None:
    """A progress line (flushed: pip reads the output through a pipe)."""
    print(f"idem: {message}", flush=True)


def elapsed(since: float) -> str:
    s = int(time.monotonic() - since)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(idem VERSION (\d+\.\d+\.\d+)", text)
    if not m:
        raise SystemExit(f"setup.py: no project(idem VERSION ...) in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        started = time.monotonic()
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        reuse = os.environ.get("IDEM_CMAKE_BUILD_DIR")
        if reuse:
            # pip runs this in python/: a relative path is taken from the repository's root.
            build = Path(reuse) if Path(reuse).is_absolute() else ROOT / reuse
            if not (build / "CMakeCache.txt").exists():
                raise SystemExit(f"setup.py: IDEM_CMAKE_BUILD_DIR={reuse} is not a configured build tree")
            say(f"using the CMake build tree {build} (IDEM_CMAKE_BUILD_DIR)")
        else:
            build = Path(self.build_temp).resolve() / "cmake"
            self.configure(build)
        jobs = str(os.cpu_count() or 2)
        launcher = self.cache_value(build, "CMAKE_CXX_COMPILER_LAUNCHER")
        say(
            f"compiling the C++ library (every store found) and the extension module with {jobs} "
            f"jobs{', through ' + launcher if launcher else ''}: the first time a few minutes on two "
            "cores, one line per step below ([done/total]); again, only what changed"
        )
        subprocess.run(["cmake", "--build", str(build), "--target", "idem_python", "-j", jobs], check=True)
        built = Path((build / "python" / "extension-path.txt").read_text().strip())
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not built.name.endswith(suffix):
            raise SystemExit(
                f"setup.py: {built} was built for another Python than {sys.executable} "
                f"(expected a name ending in {suffix}); configure with -DPython_EXECUTABLE={sys.executable}"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)
        say(f"built {built.name} in {elapsed(started)}")

    @staticmethod
    def cache_value(build: Path, name: str) -> str:
        try:
            text = (build / "CMakeCache.txt").read_text()
        except OSError:
            return ""
        m = re.search(rf"^{re.escape(name)}:[A-Z]+=(.*)$", text, re.MULTILINE)
        return m.group(1).strip() if m else ""

    def configure(self, build: Path) -> None:
        args = [
            "cmake", "-S", str(ROOT), "-B", str(build),
            # -O2, as the project's own release build (RelWithDebInfo) that the tests and
            # benchmarks run: quicker to compile than CMake's -O3, and GCC 12 at -O3 prints
            # false -Wrestrict warnings from libstdc++ that `pip install -v` would show.
            "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG",
            "-DIDEM_BUILD_PYTHON=ON",
            "-DIDEM_BUILD_TESTS=OFF", "-DIDEM_BUILD_BENCH=OFF", "-DIDEM_BUILD_EXAMPLES=OFF",
            "-DIDEM_BUILD_CLI=OFF", "-DIDEM_WITH_TESTING=OFF",
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        args += shlex.split(os.environ.get("IDEM_CMAKE_ARGS", ""))
        say(f"configuring the CMake build in {build}")
        subprocess.run(args, check=True)


setup(
    version=version(),
    ext_modules=[Extension("idem._idem", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
