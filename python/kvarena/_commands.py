"""The console commands a kvarena wheel installs, ``kvarenad`` and ``kvarena``.

Each execs the binary the wheel carries in ``kvarena/_bin/`` with the same arguments, so
the process is the binary itself: its pid, its signals, its exit status. A CMake build or
``cmake --install`` has no ``_bin/``: there the binaries are ``build/daemon/kvarenad`` and
``PREFIX/bin/kvarenad``.
"""

import os
import signal
import sys
from pathlib import Path

_BIN = Path(__file__).resolve().parent / "_bin"


def binary(name):
    """The path of the wheel's ``kvarenad`` or ``kvarena``; FileNotFoundError without one."""
    path = _BIN / name
    if not path.is_file():
        raise FileNotFoundError(f"kvarena: no {name} in {_BIN} (installed from a wheel?)")
    return str(path)


def _exec(name):
    path = binary(name)
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.execv(path, [sys.argv[0], *sys.argv[1:]])


def kvarenad():
    _exec("kvarenad")


def kvarena():
    _exec("kvarena")
