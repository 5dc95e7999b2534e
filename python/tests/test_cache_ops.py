"""The rest of the served path and the Client's calls, as the C++ client answers them."""

import pytest
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
    _, raw_v, k_scales, v_scales = cache.get_kv(0, raw=True)  # plain pages: the values, no scales
    assert torch.equal(torch.from_dlpack(raw_v), v[:, :, :3]) and k_scales is v_scales is None
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


def served_and_local(client, seed, prompt, ns, args):
    """A served cache (namespace ns, the prompt's ids) and a local one, both float16 of 1 layer
    x 2 kv heads x 16 and `args` (the KV format), given the same 9 tokens through attention
    and attention_local, which must agree. Returns (served, local, k, v, and served's get_kv)."""
    g = torch.Generator().manual_seed(seed)
    served = client.allocate(1, 2, 16, "float16", prefix_namespace=ns, prompt_tokens=prompt,
                             **args)
    local = client.allocate(1, 2, 16, "float16", **args)
    assert served.kv_format == args["kv_format"] and served.dtype == "float16"
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
    check_raw(served, local, back_k, back_v)
    return served, local, k, v, back_k, back_v


def e4m3_values():
    """The value of each of the 256 e4m3fn codes, from the format's definition (NaN left out)."""
    codes = torch.arange(256)
    e, m = (codes >> 3) & 15, (codes & 7).double()
    t = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7).double())
    return torch.where(codes >= 128, -t, t)


def check_raw(served, local, back_k, back_v):
    """get_kv(raw=True): the codes and scales as the pages hold them, code x scale (float32)
    being what get_kv answers bit for bit; the served read, the local read and the cache the
    local path wrote all agree."""
    raw = [torch.from_dlpack(t) for t in served.get_kv(0, raw=True)]
    for other in (served.get_kv_local(0, raw=True), local.get_kv(0, raw=True)):
        assert all(torch.equal(a, torch.from_dlpack(b)) for a, b in zip(raw, other))
    codes_k, codes_v, k_scales, v_scales = raw
    for codes, scales, back in ((codes_k, k_scales, back_k), (codes_v, v_scales, back_v)):
        assert codes.shape == back.shape and scales.dtype == torch.float32
        if codes.dtype == torch.int8:  # one scale per (token, head)
            assert scales.shape == back.shape[:3]
            value = codes.float() * scales[..., None]
        else:  # fp8_e4m3: the layer's static scales, one per head
            assert codes.dtype == torch.uint8 and scales.shape == (back.shape[1],)
            value = e4m3_values().float()[codes.long()] * scales.view(1, -1, 1, 1)
        assert torch.equal(value.to(torch.float16), back)


def test_int8_kv_format_served_and_local(address, seed):
    """kv_format="int8": pages of codes and per-(token, head) scales, read back dequantized
    within half a step; the served and the local path agree; another format misses the prefix."""
    client = kvarena.connect(address)
    prompt = list(range(100, 109))
    served, local, k, v, back_k, back_v = served_and_local(
        client, seed, prompt, "int8", dict(page_size=4, kv_format="int8"))
    for got, want in ((back_k, k), (back_v, v)):
        step = want.float().abs().amax(-1, keepdim=True) / 127  # one scale per token and head
        assert ((got.float() - want.float()).abs() <= step / 2 + 1e-3).all()
    pool = client.stats()["pools"]
    assert {"dtype": "float16", "kv_format": "int8"}.items() <= next(
        p for p in pool if p["kv_format"] == "int8").items()
    view = torch.from_dlpack(served.pool_view())
    assert view.dtype == torch.int8 and tuple(view.shape[1:]) == (2, 4, 2 * 16 + 2 * 4)
    # pool_scales(): float32 views of the same rows' scales, [pages, page_size, kv heads]
    # for K and V; token t sits at page page_ids[t // 4], slot t % 4.
    ids, t = torch.tensor(served.local_table(0).page_ids), torch.arange(9)
    raw_scales = served.get_kv(0, raw=True)[2:]
    for pool_scales, raw in zip(served.pool_scales(), raw_scales):
        pool_scales = torch.from_dlpack(pool_scales)
        assert pool_scales.dtype == torch.float32 and tuple(pool_scales.shape[1:]) == (4, 2)
        assert torch.equal(pool_scales[ids[t // 4], t % 4].T, torch.from_dlpack(raw)[0])
    assert served.k_scales == served.v_scales == []
    plain = client.allocate(1, 2, 16, "float16", page_size=4, prefix_namespace="int8",
                            prompt_tokens=prompt)
    assert plain.cached_tokens == 0  # same namespace and geometry, another KV format
    again = client.allocate(1, 2, 16, "float16", page_size=4, kv_format="int8",
                            prefix_namespace="int8", prompt_tokens=prompt)
    assert again.cached_tokens == 8
    for c in (served, local, plain, again):
        c.release()


def test_fp8_kv_format_static_scales_served_and_local(address, seed):
    """kv_format="fp8_e4m3" with per-head static scales: pages hold e4m3 codes of x / scale,
    read back as value x scale; the served and the local path agree; the pool's bytes are
    torch's float8_e4m3fn; another scale misses the prefix."""
    client = kvarena.connect(address)
    prompt = list(range(200, 209))
    k_scales, v_scales = [0.5, 2.0], [1.0, 0.25]  # [layers=1][kv heads=2]
    args = dict(page_size=4, kv_format="fp8_e4m3", k_scales=k_scales, v_scales=v_scales)
    served, local, k, v, back_k, back_v = served_and_local(client, seed, prompt, "fp8", args)
    for got, want, scales in ((back_k, k, k_scales), (back_v, v, v_scales)):
        s = torch.tensor(scales).view(1, 2, 1, 1)
        # Half a step of 3 mantissa bits (2^-4 relative), or of the subnormals' 2^-9 x scale.
        bound = torch.maximum(want.float().abs() * 2**-4, s * 2**-10) + 1e-3
        assert ((got.float() - want.float()).abs() <= bound).all()
    view = torch.from_dlpack(served.pool_view())
    assert view.dtype == torch.uint8 and tuple(view.shape[1:]) == (2, 4, 2, 16)
    assert (served.k_scales, served.v_scales) == (k_scales, v_scales)
    assert [torch.from_dlpack(s).tolist() for s in served.pool_scales()] == [[k_scales], [v_scales]]
    # The bytes are e4m3fn codes (torch.float8_e4m3fn where torch has it), decoded here from
    # the format's definition: K of the first two pages is get_kv's K over its scales.
    pages = e4m3_values()[view[torch.tensor(served.local_table(0).page_ids[:2])].long()]
    k_pages = pages[:, 0].reshape(8, 2, 16).permute(1, 0, 2)  # [heads][tokens][dim]
    assert torch.equal(k_pages, back_k[0, :, :8].double() / torch.tensor(k_scales).view(2, 1, 1))
    other = client.allocate(1, 2, 16, "float16", prefix_namespace="fp8", prompt_tokens=prompt,
                            **dict(args, k_scales=[0.5, 1.0]))
    assert other.cached_tokens == 0  # one static scale differs
    again = client.allocate(1, 2, 16, "float16", prefix_namespace="fp8", prompt_tokens=prompt,
                            **args)
    assert again.cached_tokens == 8
    with pytest.raises(kvarena.InvalidArgument, match="spec.k_scales has 1 entries"):
        client.allocate(1, 2, 16, "float16", **dict(args, k_scales=[1.0]))
    for c in (served, local, other, again):
        c.release()
