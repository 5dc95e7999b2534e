"""The rest of the served path and the Client's calls, as the C++ client answers them."""

import torch

import kvarena


def test_cache_operations(address, seed):
    g = torch.Generator().manual_seed(seed)
    client = kvarena.connect(address)
    assert client.health() == "SERVING"
    cache = client.allocate(2, 2, 8, torch.float32, page_size=4, prefix_namespace="ops",
                            prompt_tokens=[5, 6, 7, 8, 9])
    assert (cache.num_layers, cache.num_kv_heads, cache.head_dim, cache.page_size) == (2, 2, 8, 4)
    assert cache.dtype == "float32" and cache.is_valid and cache.num_tokens == 0
    k, v = torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    for layer in range(2):
        r = cache.append(layer, k, v)
        assert r.layer_len == 5
    assert r.seq_len == 5 and cache.num_tokens == 5
    assert len(cache.block_table(0)) == 2
    assert cache.stats()["seq_len"] == 5
    assert any(c["cache_id"] == cache.cache_id and c["seq_len"] == 5 for c in client.list_caches())
    assert client.cache_stats(cache.cache_id)["pages_used"] == cache.stats()["pages_used"]

    fork = cache.fork()
    assert fork.cache_id != cache.cache_id and fork.num_tokens == 5
    assert torch.equal(torch.from_dlpack(fork.get_kv(1)[0]), k)

    assert cache.popn(2) == 2 and cache.num_tokens == 3
    assert torch.equal(torch.from_dlpack(cache.get_kv(0)[1]), v[:, :, :3])
    assert cache.popn(10) == 0 and cache.num_tokens == 3  # refused: all or nothing
    cache.set_tokens(3, [1, 2])
    short = cache.with_sequence_length(2)
    assert short.num_tokens == 2 and short.cache_id == cache.cache_id
    same = client.open_cache(cache.cache_id)
    assert same.num_tokens == 3
    cache.reset(keep_pages=True)
    assert cache.num_tokens == 0 and cache.stats()["pages_used"] > 0
    cache.reset()
    assert cache.stats()["pages_used"] == 0
    stats = client.stats()
    assert stats["pages"]["forks"] >= 1 and stats["backend"] == "host"
    assert stats["pools"] and "page_bytes" in stats["pools"][0]
    assert stats["pools"][0]["owner"] == ""  # no --tenants_file: no tenant owns a pool
    cache.release()
    fork.release()
    assert not cache.is_valid


def test_local_table_and_attention_local(address, seed):
    g = torch.Generator().manual_seed(seed)
    client = kvarena.connect(address)
    local = client.allocate(1, 2, 8, "float32", page_size=4)
    served = client.allocate(1, 2, 8, "float32", page_size=4)
    for n in (6, 1, 1):
        q = torch.randn(1, 4, n, 8, generator=g)
        k, v = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
        local.reserve(n)
        table = local.local_table(0)
        assert table.reserved_until >= table.written + n
        a = local.attention_local(0, q, k, v)
        assert local.local_table(0).written == table.written + n
        local.commit(n)
        b = served.attention(0, q, k, v)
        assert torch.allclose(a, b, atol=1e-5)
    assert local.num_tokens == served.num_tokens == 8
    assert client.call_counts()["commit"] >= 3
    local.release()
    served.release()


def test_int8_kv_format_served_and_local(address, seed):
    """kv_format="int8": pages of codes and per-(token, head) scales, read back dequantized
    within half a step; the served and the local path agree; another format misses the prefix."""
    g = torch.Generator().manual_seed(seed)
    client = kvarena.connect(address)
    prompt = list(range(100, 109))
    served = client.allocate(1, 2, 16, "float16", page_size=4, kv_format="int8",
                             prefix_namespace="int8", prompt_tokens=prompt)
    local = client.allocate(1, 2, 16, "float16", page_size=4, kv_format="int8")
    assert served.kv_format == "int8" and served.dtype == "float16"
    k = torch.randn(1, 2, 9, 16, generator=g).to(torch.float16)
    v = torch.randn(1, 2, 9, 16, generator=g).to(torch.float16)
    q = torch.randn(1, 4, 9, 16, generator=g).to(torch.float16)
    out = served.attention(0, q, k, v)
    local.reserve(9)
    out_local = local.attention_local(0, q, k, v)
    local.commit(9)
    assert torch.allclose(torch.from_dlpack(out).float(), torch.from_dlpack(out_local).float(),
                          atol=2e-3)
    back_k, back_v = (torch.from_dlpack(t) for t in served.get_kv(0))
    assert back_k.dtype == torch.float16
    for got, want in ((back_k, k), (back_v, v)):
        step = want.float().abs().amax(-1, keepdim=True) / 127  # one scale per token and head
        assert ((got.float() - want.float()).abs() <= step / 2 + 1e-3).all()
    pool = client.stats()["pools"]
    assert {"dtype": "float16", "kv_format": "int8"}.items() <= next(
        p for p in pool if p["kv_format"] == "int8").items()
    view = torch.from_dlpack(served.pool_view())
    assert view.dtype == torch.int8 and tuple(view.shape[1:]) == (2, 4, 2 * 16 + 2 * 4)
    plain = client.allocate(1, 2, 16, "float16", page_size=4, prefix_namespace="int8",
                            prompt_tokens=prompt)
    assert plain.cached_tokens == 0  # same namespace and geometry, another KV format
    again = client.allocate(1, 2, 16, "float16", page_size=4, kv_format="int8",
                            prefix_namespace="int8", prompt_tokens=prompt)
    assert again.cached_tokens == 8
    for c in (served, local, plain, again):
        c.release()
