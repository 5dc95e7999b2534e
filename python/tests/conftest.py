"""Fixtures of the kvarena Python tests: a real kvarenad on a temporary Unix socket.

The daemon is the build's (KVARENAD, else <build>/daemon/kvarenad next to the kvarena
package on PYTHONPATH), started as tests/daemon/daemon_process.h starts it:
--listen=unix:<tmp>/kvarena.sock --backend=host, plus the flags a test needs; it is
ready once Health answers SERVING and its log has the "kvarenad: serving " line.
"""

import gc
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import kvarena

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))


def kvarenad_path():
    if os.environ.get("KVARENAD"):
        return os.environ["KVARENAD"]
    build = pathlib.Path(kvarena.__file__).resolve().parents[2]  # <build>/python/kvarena
    return str(build / "daemon" / "kvarenad")


class Daemon:
    """kvarenad on unix:<dir>/kvarena.sock; stop() kills it and removes the directory."""

    def __init__(self, *flags, start_timeout=20.0):
        self.dir = tempfile.mkdtemp(prefix="kvarena-py-")
        self.socket = os.path.join(self.dir, "kvarena.sock")
        self.address = "unix:" + self.socket
        self.log_path = os.path.join(self.dir, "kvarenad.log")
        argv = [kvarenad_path(), f"--listen={self.address}", "--backend=host",
                "--arena_bytes=1Gi", "--num_threads=2", *flags]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvarenad exited at start: {self.log()}")
            if "kvarenad: serving " in self.log() and self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"kvarenad did not serve within {start_timeout}s: {self.log()}")

    def _healthy(self):
        try:
            c = kvarena.connect(self.address, attach=False, connect_timeout=1.0)
            return c.health() == "SERVING"
        except kvarena.Error:
            return False

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon():
    # A short grace, so that a killed worker's session is reaped while the test waits.
    d = Daemon("--session_grace=500ms")
    yield d
    d.stop()


@pytest.fixture(params=["unix", "inproc"])
def address(request, daemon):
    return daemon.address if request.param == "unix" else "inproc:"


@pytest.fixture
def client(daemon):
    c = kvarena.connect(daemon.address, client_name="pytest")
    yield c
    del c
    gc.collect()  # close the session (and its scratch region) before the next test


@pytest.fixture
def seed():
    """A fresh seed per test, printed (pytest shows it on failure); KVARENA_SEED fixes it."""
    s = int(os.environ.get("KVARENA_SEED", random.randrange(1 << 31)))
    print(f"seed {s} (KVARENA_SEED={s} repeats it)")
    return s


def wait_for(predicate, timeout=20.0, what="condition"):
    """Polls predicate() until true; fails the test at the deadline (a bound, not a measure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
