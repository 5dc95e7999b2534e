"""fork() with a live client: the child's inherited client refuses every call with
FailedPrecondition and leaves the parent's connection alone; a fork() child may not connect
anew (gRPC's runtime is the parent's) and is told so at once, a spawned one is served; the
parent's handle keeps working throughout (no timeout, no broken connection)."""

import gc
import os

import torch

import kvarena


def fork_child(body):
    """Runs body() in a fork() child; returns its exit code (0: body returned True)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if body() else 1
        except BaseException as e:  # the child reports and exits, never returns into pytest
            print(f"child: {type(e).__name__}: {e}", flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"child ended by signal {os.WTERMSIG(status)}"
    return os.WEXITSTATUS(status)


def refused(call):
    try:
        call()
    except kvarena.FailedPrecondition as e:
        return f"used in pid {os.getpid()} after fork()" in e.message
    return False


def parent_cache(client):
    cache = client.allocate(2, 2, 16, "float32", page_size=4)
    k = torch.ones(1, 2, 3, 16)
    cache.append(0, k, k)
    return cache


def test_child_refuses_the_inherited_client_and_the_parent_keeps_working(daemon):
    client = kvarena.connect(daemon.address, client_name="fork-parent")
    cache = parent_cache(client)
    k = torch.ones(1, 2, 1, 16)
    parent = os.getpid()

    def child():
        ok = all([
            refused(lambda: cache.append(0, k, k)),
            refused(lambda: cache.attention(0, torch.ones(1, 4, 1, 16), k, k)),
            refused(lambda: cache.get_kv(0)),
            refused(lambda: cache.reserve(1)),
            refused(lambda: cache.popn(1)),
            refused(lambda: client.stats()),
            refused(lambda: client.allocate(1, 2, 16, "float32")),
            refused(lambda: client.ping()),
            not client.connected, not cache.is_valid,
        ])
        try:
            client.ping()
        except kvarena.FailedPrecondition as e:
            ok = ok and f"created in pid {parent}" in e.message
        return ok

    assert fork_child(child) == 0
    # The parent: same connection, same session, every call served.
    assert client.connected and cache.is_valid
    client.ping()
    assert cache.append(0, k, k).seq_len == 4
    assert cache.attention(1, torch.ones(1, 4, 1, 16), k, k).shape == (1, 4, 1, 16)
    assert client.stats()["num_caches"] >= 1
    cache.release()


def test_child_that_drops_the_inherited_client_leaves_the_parent_alone(daemon):
    client = kvarena.connect(daemon.address, client_name="fork-parent")
    cache = parent_cache(client)
    view = torch.from_dlpack(cache.pool_view())

    def child():
        nonlocal client, cache, view
        del view, cache, client  # the last references: the transport is leaked, not closed
        gc.collect()
        return True

    assert fork_child(child) == 0
    k = torch.ones(1, 2, 1, 16)
    assert cache.append(0, k, k).seq_len == 4
    client.ping()
    cache.release()


def test_child_cannot_connect_and_the_parent_is_unharmed(daemon):
    client = kvarena.connect(daemon.address, client_name="fork-parent")
    cache = parent_cache(client)

    def child():
        # gRPC's runtime is the parent's (docs/python.md, "fork()"): refused at once.
        try:
            kvarena.connect(daemon.address, client_name="fork-child")
        except kvarena.FailedPrecondition as e:
            return "fork() child of pid" in e.message and "spawn" in e.message
        return False

    assert fork_child(child) == 0
    k = torch.ones(1, 2, 1, 16)
    for _ in range(3):  # each would fail DeadlineExceeded had the child taken the replies
        assert cache.append(0, k, k).seq_len >= 4
        client.ping()
    cache.release()


def test_spawned_child_connects(daemon):
    import multiprocessing
    client = kvarena.connect(daemon.address, client_name="spawn-parent")
    cache = parent_cache(client)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(spawned_worker, (daemon.address,)) == [1, 4, 2, 16]
    k = torch.ones(1, 2, 1, 16)
    assert cache.append(0, k, k).seq_len == 4
    client.ping()
    cache.release()


def spawned_worker(address):
    fresh = kvarena.connect(address, client_name="spawned-child")
    mine = fresh.allocate(1, 2, 16, "float32", page_size=4)
    k = torch.ones(1, 2, 2, 16)
    return list(mine.attention(0, torch.ones(1, 4, 2, 16), k, k).shape)
