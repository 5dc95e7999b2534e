"""The worker of tests/wheel/wheel_test.sh, run from a temporary directory with the venv's
python, so that `import kvarena` is the installed wheel's, never the source tree's.

    worker.py ADDRESS VENV VERSION [SEED]

Served path against the wheel's kvarenad, float32 numpy in and out: allocates a cache with
a prefix namespace, appends a prompt's first tokens and attends over the rest, releases it,
allocates a second cache with the same prompt (it adopts the full pages, no copy), checks
the adopted K/V bit for bit and its attention over them against a float64 numpy reference,
and releases it. Prints the seed first; exits non-zero on any mismatch.
"""

import importlib.metadata
import os
import random
import sys

import numpy as np

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, PAGE_SIZE = 2, 2, 4, 16, 4
PROMPT_LEN, APPENDED = 10, 6


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
    assert isinstance(got, np.ndarray), f"{what}: {type(got)}, not numpy out for numpy in"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    err = float(np.abs(got - want).max())
    assert err < tol, f"{what}: max error {err} >= {tol}"
    print(f"worker: {what}: max error {err:.2e}")


def main():
    address, venv, version = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else random.randrange(1 << 31)
    print(f"worker: seed {seed} (replay: worker.py ADDRESS VENV VERSION {seed})")
    import kvarena
    where = os.path.realpath(kvarena.__file__)
    assert where.startswith(venv + os.sep), f"kvarena imported from {where}, not {venv}"
    assert importlib.metadata.version("kvarena") == version, importlib.metadata.version("kvarena")
    print(f"worker: kvarena {version} from {where}")

    rng = np.random.default_rng(seed)
    rand = lambda *shape: rng.standard_normal((1, *shape), dtype=np.float32)  # noqa: E731
    prompt = [int(t) for t in rng.integers(0, 1000, PROMPT_LEN)]
    ks = [rand(KV_HEADS, PROMPT_LEN, HEAD_DIM) for _ in range(LAYERS)]
    vs = [rand(KV_HEADS, PROMPT_LEN, HEAD_DIM) for _ in range(LAYERS)]
    qs = [rand(Q_HEADS, PROMPT_LEN, HEAD_DIM) for _ in range(LAYERS)]

    client = kvarena.connect(address, client_name="wheel-worker")
    spec = dict(num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype="float32",
                page_size=PAGE_SIZE, prefix_namespace=f"wheel-{seed}", prompt_tokens=prompt)
    first = client.allocate(**spec)
    assert first.cached_tokens == 0, first.cached_tokens
    for layer in range(LAYERS):
        k, v, q = ks[layer], vs[layer], qs[layer]
        appended = first.append(layer, k[:, :, :APPENDED].copy(), v[:, :, :APPENDED].copy())
        assert appended.layer_len == APPENDED, appended.layer_len
        out = first.attention(layer, q[:, :, APPENDED:].copy(), k[:, :, APPENDED:].copy(),
                              v[:, :, APPENDED:].copy())
        check_close(f"first cache, layer {layer}, attention over appended + new", out,
                    reference(q[:, :, APPENDED:], k, v, APPENDED))
    first.release()  # its full pages stay cached under the namespace

    second = client.allocate(**spec)
    reused = (PROMPT_LEN - 1) // PAGE_SIZE * PAGE_SIZE
    assert second.cached_tokens == reused, (second.cached_tokens, reused)
    for layer in range(LAYERS):
        k, v, q = ks[layer], vs[layer], qs[layer]
        got_k, got_v = (np.from_dlpack(x) for x in second.get_kv(layer))
        assert np.array_equal(got_k, k[:, :, :reused]), f"layer {layer}: adopted K differs"
        assert np.array_equal(got_v, v[:, :, :reused]), f"layer {layer}: adopted V differs"
        out = second.attention(layer, q[:, :, reused:].copy(), k[:, :, reused:].copy(),
                               v[:, :, reused:].copy())
        check_close(f"second cache, layer {layer}, attention over the reused prefix", out,
                    reference(q[:, :, reused:], k, v, reused))
    print(f"worker: prefix reuse: {reused} of {PROMPT_LEN} tokens adopted")
    cache_id = second.cache_id
    second.release()
    assert cache_id not in [c["cache_id"] for c in client.list_caches()], "release left it"
    print("worker: ok")


if __name__ == "__main__":
    main()
