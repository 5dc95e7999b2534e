"""The Python worker of tests/image/image_test.sh, outside the container, against the
image's kvarenad through the bind-mounted socket directory:

    worker.py ADDRESS NAMESPACE [SEED]

with the build's module on PYTHONPATH. Served path, float32 numpy: allocates a cache with a
prefix namespace and a prompt, attends over the prompt, releases it; allocates a second
cache with the same prompt, which adopts the full pages (checked bit for bit with get_kv),
attends over the rest; then the local path over the mapped pool (the fd socket): reserve,
attention_local, commit. Every output is checked against a float64 numpy reference. Prints
"worker ok" at the end; exits non-zero on any mismatch.
"""

import random
import sys

import numpy as np

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, PAGE_SIZE = 2, 2, 4, 16, 4
PROMPT_LEN = 14


def reference(q, k, v, q_pos):
    """Causal GQA attention in float64: q [1, Q_HEADS, n, D] at positions q_pos.., over
    k, v [1, KV_HEADS, T, D] (positions 0..T-1); query head h reads kv head h // group."""
    q, k, v = (x.astype(np.float64)[0] for x in (q, k, v))
    group = Q_HEADS // KV_HEADS
    out = np.empty_like(q)
    for h in range(Q_HEADS):
        for i in range(q.shape[1]):
            last = q_pos + i
            s = k[h // group, :last + 1] @ q[h, i] / np.sqrt(HEAD_DIM)
            w = np.exp(s - s.max())
            out[h, i] = (w / w.sum()) @ v[h // group, :last + 1]
    return out[None]


def check_close(what, got, want, tol=1e-4):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    err = float(np.abs(got - want).max())
    assert err < tol, f"{what}: max error {err} >= {tol}"


def main():
    address, namespace = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else random.randrange(1 << 31)
    print(f"worker.py: seed {seed} (replay: worker.py ADDRESS NAMESPACE {seed})")
    import kvarena
    rng = np.random.default_rng(seed)
    rand = lambda *shape: rng.standard_normal((1, *shape), dtype=np.float32)  # noqa: E731
    total = PROMPT_LEN + 1  # the prompt, then one token through the local path
    prompt = [int(t) for t in rng.integers(0, 1000, PROMPT_LEN)]
    ks = [rand(KV_HEADS, total, HEAD_DIM) for _ in range(LAYERS)]
    vs = [rand(KV_HEADS, total, HEAD_DIM) for _ in range(LAYERS)]
    qs = [rand(Q_HEADS, total, HEAD_DIM) for _ in range(LAYERS)]

    client = kvarena.connect(address, client_name="image-test-python")
    assert client.health() == "SERVING", client.health()
    spec = dict(num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype="float32",
                page_size=PAGE_SIZE, prefix_namespace=namespace, prompt_tokens=prompt)

    first = client.allocate(**spec)
    assert first.cached_tokens == 0, first.cached_tokens
    for layer in range(LAYERS):
        k, v, q = (x[:, :, :PROMPT_LEN].copy() for x in (ks[layer], vs[layer], qs[layer]))
        check_close(f"first cache, layer {layer}", first.attention(layer, q, k, v),
                    reference(q, k, v, 0))
    first.release()  # its full pages stay cached under the namespace
    print("worker.py: allocated, attended and released the first cache")

    second = client.allocate(**spec)
    reused = (PROMPT_LEN - 1) // PAGE_SIZE * PAGE_SIZE
    assert second.cached_tokens == reused, (second.cached_tokens, reused)
    for layer in range(LAYERS):
        k, v, q = ks[layer], vs[layer], qs[layer]
        got_k, got_v = (np.from_dlpack(x) for x in second.get_kv(layer))
        assert np.array_equal(got_k, k[:, :, :reused]), f"layer {layer}: adopted K differs"
        assert np.array_equal(got_v, v[:, :, :reused]), f"layer {layer}: adopted V differs"
        n = slice(reused, PROMPT_LEN)
        out = second.attention(layer, q[:, :, n].copy(), k[:, :, n].copy(), v[:, :, n].copy())
        check_close(f"second cache, layer {layer}", out,
                    reference(q[:, :, n], k[:, :, :PROMPT_LEN], v[:, :, :PROMPT_LEN], reused))
    print(f"worker.py: prefix reuse: {reused} of {PROMPT_LEN} tokens adopted")

    # The local path: this process maps the pool (its fd came over the fd socket).
    second.reserve(1)
    pool = np.from_dlpack(second.pool_view())
    assert pool.shape[1:] == (2, PAGE_SIZE, KV_HEADS, HEAD_DIM), pool.shape
    for layer in range(LAYERS):
        k, v, q = ks[layer], vs[layer], qs[layer]
        n = slice(PROMPT_LEN, total)
        out = second.attention_local(layer, q[:, :, n].copy(), k[:, :, n].copy(),
                                     v[:, :, n].copy())
        check_close(f"local path, layer {layer}", out, reference(q[:, :, n], k, v, PROMPT_LEN))
    second.commit(1)
    assert second.seq_len == total, second.seq_len
    print(f"worker.py: local path: 1 token over the mapped pool ({pool.shape[0]} pages)")
    cache_id = second.cache_id
    second.release()
    assert cache_id not in [c["cache_id"] for c in client.list_caches()], "release left it"
    print("worker ok")


if __name__ == "__main__":
    main()
