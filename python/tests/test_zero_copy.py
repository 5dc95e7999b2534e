"""Zero copy and lifetimes: pool_view is the mapped pool itself, and a view keeps the
mapping alive after the Cache and the Client are gone."""

import gc

import torch

import kvarena
from conftest import wait_for


def write_token_through_view(cache, pool, layer, k, v):
    """Writes one token's K/V ([KVH, D]) at the cache's next slot through the torch view."""
    t = kvarena.vllm_block_tables([(cache, 1)], layer, like=k)
    slot = int(t.slot_mapping[0])
    pool[slot // cache.page_size, 0, slot % cache.page_size] = k
    pool[slot // cache.page_size, 1, slot % cache.page_size] = v
    return slot


def test_value_written_through_view_is_what_get_kv_returns(address, seed):
    g = torch.Generator().manual_seed(seed)
    client = kvarena.connect(address)
    cache = client.allocate(2, 2, 8, torch.float32, page_size=4)
    view = cache.pool_view()
    assert view.device == "cpu" and view.dtype == "float32"
    pool = torch.from_dlpack(view)
    assert pool.shape[1:] == (2, 4, 2, 8)
    assert pool.data_ptr() == view.data_ptr  # no copy
    assert torch.from_dlpack(cache.pool_view()).data_ptr() == pool.data_ptr()  # same each call
    written = []
    for _ in range(6):
        cache.reserve(1)
        ks = [torch.randn(2, 8, generator=g) for _ in range(2)]
        vs = [torch.randn(2, 8, generator=g) for _ in range(2)]
        for layer in range(2):
            write_token_through_view(cache, pool, layer, ks[layer], vs[layer])
        cache.commit(1)
        written.append((ks, vs))
    for layer in range(2):
        k, v = (torch.from_dlpack(t) for t in cache.get_kv(layer))
        assert k.shape == (1, 2, 6, 8)
        for i, (ks, vs) in enumerate(written):
            assert torch.equal(k[0, :, i], ks[layer])
            assert torch.equal(v[0, :, i], vs[layer])
    assert torch.from_dlpack(cache.pool_view()).data_ptr() == pool.data_ptr()
    cache.release()


def test_view_outlives_client(daemon, seed):
    g = torch.Generator().manual_seed(seed)
    observer = kvarena.connect(daemon.address, attach=False)
    client = kvarena.connect(daemon.address)
    cache = client.allocate(1, 1, 4, "float32", page_size=4)
    q, k, v = (torch.randn(1, 1, 3, 4, generator=g) for _ in range(3))
    cache.attention(0, q, k, v)
    pool = torch.from_dlpack(cache.pool_view())
    pages = cache.block_table(0)
    cache_id = cache.cache_id
    before = pool[pages[0], 0, :3].clone()
    assert torch.equal(before[:, 0], k[0, 0])
    del cache, client
    gc.collect()
    # The view holds a handle, and so the connection, its session and the cache: the
    # bytes are still there, in this process's mapping.
    assert torch.equal(pool[pages[0], 0, :3], before)
    assert any(c["cache_id"] == cache_id for c in observer.list_caches())
    pool[pages[0], 0, 0] += 0  # and still writable without a fault
    del pool
    gc.collect()
    # The last view gone, the connection closes and the session's cache is released.
    wait_for(lambda: not any(c["cache_id"] == cache_id for c in observer.list_caches()),
             what="the cache to be released once the last view is gone")


def test_served_output_is_a_fresh_tensor_each_call(client, seed):
    g = torch.Generator().manual_seed(seed)
    cache = client.allocate(1, 1, 4, "float32")
    q, k, v = (torch.randn(1, 1, 1, 4, generator=g) for _ in range(3))
    a = cache.attention(0, q, k, v)
    b = cache.attention(0, q, k, v)
    assert a.data_ptr() != b.data_ptr()
    raw = cache.get_kv(0)[0]
    assert isinstance(raw, kvarena.Tensor) and raw.shape == (1, 1, 2, 4)
    assert torch.from_dlpack(raw).data_ptr() == raw.data_ptr
    cache.release()
