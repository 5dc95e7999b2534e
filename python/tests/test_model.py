"""The model loop: a Llama-shaped model generating three ways (examples/llama_decode.py),
and served attention in float16 / bfloat16 against a float64 reference."""

import math

import pytest
import torch

import kvarena
import llama_decode


def small_config():
    return llama_decode.Config(layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=97,
                               ffn=128, window=12, window_layer=1, page_size=4)


def test_three_ways_agree(address, seed):
    client = kvarena.connect(address)
    with torch.no_grad():
        r = llama_decode.run_three_ways(client, small_config(), seed, prompt_len=9,
                                        new_tokens=20)
    assert r["served"][0] == r["torch"][0]
    assert r["local"][0] == r["torch"][0]
    for mode in ("served", "local"):
        assert torch.allclose(r[mode][1], r["torch"][1], atol=1e-3, rtol=0), mode
    assert client.stats()["num_caches"] == 0 or address != "inproc:"


def test_example_main_runs(daemon, seed, capsys):
    assert llama_decode.main(["--address", daemon.address, "--seed", str(seed), "--layers", "2",
                              "--hidden", "64", "--vocab", "64", "--prompt_len", "5",
                              "--new_tokens", "6", "--window", "8", "--page_size", "4"]) == 0
    out = capsys.readouterr().out
    assert f"seed {seed}" in out and "torch and served and local agree" in out
    for mode in ("torch", "served", "local"):
        assert f"{mode}:" in out and "tokens/s" in out


def reference_attention(q, keys, values, window=0):
    """float64 causal GQA attention of q [1, H, T, D] over keys/values [1, KVH, S, D],
    the T queries being the last T positions."""
    q, k, v = (t.to(torch.float64)[0] for t in (q, keys, values))
    H, T, D = q.shape
    S = k.shape[1]
    k = k.repeat_interleave(H // k.shape[0], dim=0)
    v = v.repeat_interleave(H // v.shape[0], dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(D)
    qp = torch.arange(S - T, S)[:, None]
    kp = torch.arange(S)[None, :]
    allowed = kp <= qp
    if window:
        allowed &= kp > qp - window
    return (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v)[None]


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-2), (torch.bfloat16, 6e-2),
                                       (torch.float32, 1e-4)])
def test_served_attention_matches_float64(client, seed, dtype, tol):
    g = torch.Generator().manual_seed(seed)
    H, KVH, D = 8, 2, 32
    cache = client.allocate(1, KVH, D, dtype, page_size=8)
    ks, vs = [], []
    for T in (11, 1, 1, 5):  # a prompt, two decode steps, a speculative chunk
        q, k, v = (torch.randn(1, h, T, D, generator=g).to(dtype) for h in (H, KVH, KVH))
        out = cache.attention(0, q, k, v)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == q.shape
        ks.append(k)
        vs.append(v)
        ref = reference_attention(q, torch.cat(ks, 2), torch.cat(vs, 2))
        assert (out.to(torch.float64) - ref).abs().max() < tol
    assert cache.num_tokens == 18
    k_all, v_all = cache.get_kv(0)
    assert torch.equal(torch.from_dlpack(k_all), torch.cat(ks, 2))
    assert torch.equal(torch.from_dlpack(v_all), torch.cat(vs, 2))
    cache.release()


def test_numpy_in_numpy_out(client, seed):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(seed)
    cache = client.allocate(1, 2, 16, np.float32)
    q = rng.standard_normal((1, 4, 3, 16), dtype=np.float32)
    k = rng.standard_normal((1, 2, 3, 16), dtype=np.float32)
    v = rng.standard_normal((1, 2, 3, 16), dtype=np.float32)
    v_readonly = v.copy()
    v_readonly.setflags(write=False)  # numpy exports no read-only array by DLPack: its buffer
    out = cache.attention(0, q, k, v_readonly)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    ref = reference_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))
    assert np.abs(out - ref.numpy()).max() < 1e-4
    cache.release()
