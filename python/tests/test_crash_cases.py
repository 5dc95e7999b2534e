"""Calls that used to kill or corrupt the calling process, each run in a child Python
process: the child must get a typed kvarena error and exit normally (a crash shows as a
negative return code), and the parent's own client must still work after.

- a served call past the message limit (gRPC aborted past 2 GiB, and serialized 512 MiB
  before refusing at 64 MiB): refused with ResourceExhausted, both numbers named;
- DecodeBatch.run(out=...) into read-only memory (a read-only memmap faulted; an array
  with writeable=False and a view of bytes were written): refused with InvalidArgument,
  the memory unchanged.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kvarena

# Prints one JSON line: the error's class and message, or "none".
PRELUDE = textwrap.dedent("""
    import json, os, sys, tempfile
    import numpy as np
    import kvarena

    def report(call, **extra):
        try:
            call()
            result = {"error": "none"}
        except kvarena.Error as e:
            result = {"error": type(e).__name__, "message": e.message}
        result.update({k: v() for k, v in extra.items()})
        print(json.dumps(result), flush=True)

    address = sys.argv[1]
""")


def run_child(address, body):
    """Runs PRELUDE + body in a fresh interpreter; returns its JSON line."""
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), address],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, f"child exited with {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def parent_still_works(client):
    cache = client.allocate(1, 8, 128, "float32", page_size=16)
    k = torch.ones(1, 8, 2, 128)
    assert cache.append(0, k, k).seq_len == 2
    assert client.health() == "SERVING"
    cache.release()


# 8 kv heads x 128 x float32 is 4 KiB a token for each of k and v.
@pytest.mark.parametrize("tokens,request_bytes", [(65536, 2 * 256 << 20),
                                                   (262144, 2 * 1024 << 20)])
def test_append_past_the_message_limit(daemon, client, tokens, request_bytes):
    got = run_child(daemon.address, f"""
        client = kvarena.connect(address)
        cache = client.allocate(1, 8, 128, "float32", page_size=16)
        # np.zeros maps its pages lazily: the child never touches these bytes.
        k = np.zeros((1, 8, {tokens}, 128), np.float32)
        v = np.zeros((1, 8, {tokens}, 128), np.float32)
        report(lambda: cache.append(0, k, v), seq_len=lambda: cache.stats()["seq_len"])
    """)
    assert got["error"] == "ResourceExhausted", got
    assert str(request_bytes) in got["message"]
    assert f"max_message_bytes={64 << 20}" in got["message"]
    assert got["seq_len"] == 0  # nothing reached the daemon
    parent_still_works(client)


def test_attention_past_the_message_limit(daemon, client):
    got = run_child(daemon.address, """
        client = kvarena.connect(address)
        cache = client.allocate(1, 8, 128, "float32", page_size=16)
        k = np.zeros((1, 8, 8192, 128), np.float32)   # 32 MiB each of q, k, v
        report(lambda: cache.attention(0, k, k, k), seq_len=lambda: cache.stats()["seq_len"])
    """)
    assert got["error"] == "ResourceExhausted", got
    assert str(3 * 32 << 20) in got["message"] and "max_message_bytes=" in got["message"]
    assert got["seq_len"] == 0
    parent_still_works(client)


def test_prompt_past_the_message_limit(daemon, client):
    got = run_child(daemon.address, """
        client = kvarena.connect(address, max_message_bytes=1 << 20)
        ids = list(range(1 << 28, (1 << 28) + 300000))   # 5 bytes an id on the wire
        # By id: other tests' caches may go meanwhile (their sessions ending).
        before = {c["cache_id"] for c in client.list_caches()}
        report(lambda: client.allocate(1, 8, 128, "float32", prompt_tokens=ids),
               caches_added=lambda: len({c["cache_id"] for c in client.list_caches()} - before))
    """)
    assert got["error"] == "ResourceExhausted", got
    assert "AllocateRequest" in got["message"] and "max_message_bytes=1048576" in got["message"]
    assert got["caches_added"] == 0
    parent_still_works(client)


# Each makes `out` (read-only memory of the shape q has) and `check()` (whether it is
# unchanged); decode_batch.run must refuse it before writing.
READ_ONLY_OUTS = {
    "memmap": """
        path = os.path.join(tempfile.mkdtemp(), "out.bin")
        np.full(shape, 7, np.float32).tofile(path)
        out = np.memmap(path, np.float32, mode="r", shape=shape)
        check = lambda: bool((out == 7).all())
    """,
    "writeable_false": """
        out = np.full(shape, 7, np.float32)
        out.flags.writeable = False
        check = lambda: bool((out == 7).all())
    """,
    "bytes_view": """
        blob = np.full(shape, 7, np.float32).tobytes()
        out = np.frombuffer(blob, np.float32).reshape(shape)
        check = lambda: blob == np.full(shape, 7, np.float32).tobytes()
    """,
    "memoryview_of_bytes": """
        blob = np.full(shape, 7, np.float32).tobytes()
        out = memoryview(blob).cast("B").cast("f", shape)
        check = lambda: blob == np.full(shape, 7, np.float32).tobytes()
    """,
}


@pytest.mark.parametrize("kind", sorted(READ_ONLY_OUTS))
def test_decode_batch_refuses_a_read_only_out(daemon, client, kind):
    got = run_child(daemon.address, """
        client = kvarena.connect(address)
        caches = [client.allocate(1, 2, 16, "float32", page_size=4) for _ in range(2)]
        batch = client.decode_batch(caches)
        batch.plan()
        shape = (2, 4, 1, 16)
        q = np.ones(shape, np.float32)
        k = np.ones((2, 2, 1, 16), np.float32)
    """ + READ_ONLY_OUTS[kind] + """
        report(lambda: batch.run(0, q, k, k, out=out), unchanged=check)
    """)
    assert got["error"] == "InvalidArgument", got
    assert "out:" in got["message"] and "read-only" in got["message"]
    assert got["unchanged"] is True
    parent_still_works(client)


def test_decode_batch_writes_a_writable_out(client):
    caches = [client.allocate(1, 2, 16, "float32", page_size=4) for _ in range(2)]
    batch = client.decode_batch(caches)
    batch.plan()
    q, k = torch.ones(2, 4, 1, 16), torch.ones(2, 2, 1, 16)
    import numpy as np
    out = np.full((2, 4, 1, 16), 7, np.float32)
    assert batch.run(0, q.numpy(), k.numpy(), k.numpy(), out=out) is out
    # One token attended over itself: out is v, all ones.
    assert (out == 1).all()
