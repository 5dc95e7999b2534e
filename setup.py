"""The kvarena wheel: CMake builds the extension, kvarenad and the kvarena CLI; setuptools
packages them with python/kvarena/*.py (docs/python.md, "A wheel").

    /usr/bin/python3 -m pip wheel . --no-build-isolation --no-index -w dist/

CMake configures build/wheel of this tree (Release; ccache makes a rebuild cheap) and
builds only kvarena_python, kvarenad and kvarena. Environment:
    KVARENA_WHEEL_BUILD_DIR   another build directory (default: build/wheel); one that is
                              already configured keeps its build type and generator
    KVARENA_CMAKE_ARGS        more configure arguments, e.g. -DKVARENA_CUDA=OFF
The wheel links Debian 12's gRPC, protobuf and abseil (and, where nvcc was found, the CUDA
runtime) from the system: it is tagged linux_x86_64, for machines with those libraries.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# The binaries the wheel carries in kvarena/_bin/, by CMake target, and where they are built.
BINARIES = {"kvarenad": "daemon/kvarenad", "kvarena": "tools/kvarena"}


def project_version():
    """The VERSION of CMakeLists.txt's project(): the one version of kvarena."""
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"^project\(\s*kvarena\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)\b", text, re.M)
    if not m:
        raise RuntimeError("setup.py: CMakeLists.txt has no `project(kvarena VERSION x.y.z` line")
    return m.group(1)


def build_dir():
    return Path(os.environ.get("KVARENA_WHEEL_BUILD_DIR") or ROOT / "build" / "wheel").resolve()


def run(cmd):
    print("setup.py:", shlex.join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def strip_into(src, dst):
    """Copies src to dst without its symbol table (keeps its mode)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    strip = shutil.which("strip")
    if strip:
        run([strip, "--strip-unneeded", dst])


class CMakeBuild(build_ext):
    """Builds kvarena._kvarena (and the binaries) with CMake instead of compiling sources."""

    def build_extension(self, ext):
        out = build_dir()
        configure = ["cmake", "-S", ROOT, "-B", out, f"-DPython3_EXECUTABLE={sys.executable}"]
        if not (out / "CMakeCache.txt").exists():  # an existing one keeps its configuration
            configure += ["-DCMAKE_BUILD_TYPE=Release"]
            configure += ["-G", "Ninja"] if shutil.which("ninja") else []
        configure += shlex.split(os.environ.get("KVARENA_CMAKE_ARGS", ""))
        run(configure)
        run(["cmake", "--build", out, "--parallel", str(os.cpu_count() or 1),
             "--target", "kvarena_python", *BINARIES])

        built = sorted((out / "python" / "kvarena").glob("_kvarena*.so"))
        if len(built) != 1:
            raise RuntimeError(f"setup.py: expected one _kvarena*.so in {out}/python/kvarena, "
                               f"found {[p.name for p in built]}")
        module = Path(self.get_ext_fullpath(ext.name))
        strip_into(built[0], module)
        for name, path in BINARIES.items():
            strip_into(out / path, module.parent / "_bin" / name)


setup(
    name="kvarena",
    version=project_version(),
    description="Python client of kvarena, a KV-cache daemon for LLM inference, with kvarenad",
    long_description=(ROOT / "docs" / "python.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    package_dir={"": "python"},
    packages=["kvarena"],
    ext_modules=[Extension("kvarena._kvarena", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["kvarenad = kvarena._commands:kvarenad",
                                      "kvarena = kvarena._commands:kvarena"]},
    zip_safe=False,
    # setuptools' own scratch (build/lib.*, build/bdist.*, the egg-info) under the CMake
    # build directory, not loose in the source tree.
    options={"build": {"build_base": str(build_dir() / "setuptools")},
             "egg_info": {"egg_base": str(build_dir())}},
)
