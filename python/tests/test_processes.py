"""Multi-process: prefix reuse between two Python worker processes, and a SIGKILLed worker
whose pages all come back."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import kvarena
from conftest import wait_for

WORKER = pathlib.Path(__file__).resolve().parent / "worker.py"


def start_worker(*args):
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def run_worker(*args):
    p = start_worker(*args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_second_process_reuses_the_prefix(daemon, seed):
    prompt_len, page_size = 14, 4
    first = run_worker(daemon.address, "prefix", seed, prompt_len, 6)
    assert first["cached_tokens"] == 0
    second = run_worker(daemon.address, "prefix", seed, prompt_len, 6)
    # The page-aligned prefix, below the prompt's length.
    assert second["cached_tokens"] == (prompt_len - 1) // page_size * page_size == 12
    assert second["tokens"] == first["tokens"]


def test_killed_worker_leaks_no_page(daemon):
    observer = kvarena.connect(daemon.address, attach=False)
    used_before = observer.stats()["pages"]["pages_used"]
    sessions_before = observer.stats()["num_sessions"]
    p = start_worker(daemon.address, "hold")
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "ready", p.stderr.read()
        cache_id = line[1]
        assert observer.stats()["pages"]["pages_used"] > used_before
        assert any(c["cache_id"] == cache_id for c in observer.list_caches())
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    # The daemon reaps the session after --session_grace and frees every page it held.
    # (<=: an earlier test's client may close meanwhile and free its own.)
    wait_for(lambda: observer.stats()["pages"]["pages_used"] <= used_before,
             what="the killed worker's pages to be freed")
    assert observer.stats()["num_sessions"] <= sessions_before
    assert not any(c["cache_id"] == cache_id for c in observer.list_caches())
