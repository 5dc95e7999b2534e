"""Two Python threads decoding different caches at once; the batched local path
(decode_batch) and the page-table arrays against the served path."""

import signal
import threading
import time

import pytest
import torch

import kvarena
import llama_decode
from conftest import Daemon
from test_model import reference_attention, small_config


def test_two_threads_decode_different_caches(address, seed):
    cfg = small_config()
    model = llama_decode.Model(cfg, seed)
    client = kvarena.connect(address)
    prompts = [[(seed + 7 * i + j) % cfg.vocab for j in range(6 + i)] for i in range(2)]
    with torch.no_grad():
        expected = [llama_decode.generate(model, llama_decode.TorchCache(cfg), p, 12)[0]
                    for p in prompts]
    got, errors = [None, None], []

    def worker(i):
        try:
            cache = llama_decode.allocate(client, cfg)
            kv = (llama_decode.ServedCache(cache) if i == 0
                  else llama_decode.LocalCache(cache, cfg))
            with torch.no_grad():
                got[i] = llama_decode.generate(model, kv, prompts[i], 12)[0]
            cache.release()
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_batch_matches_served(address, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    client = kvarena.connect(address)
    B, L, H, KVH, D = 3, 2, 4, 2, 16
    local = [client.allocate(L, KVH, D, dtype, page_size=4) for _ in range(B)]
    served = [client.allocate(L, KVH, D, dtype, page_size=4) for _ in range(B)]
    batch = client.decode_batch(local)
    assert batch.batch_size == B
    for step in range(9):
        batch.plan()
        assert batch.positions() == [step] * B
        for layer in range(L):
            q = torch.randn(B, H, 1, D, generator=g).to(dtype)
            k = torch.randn(B, KVH, 1, D, generator=g).to(dtype)
            v = torch.randn(B, KVH, 1, D, generator=g).to(dtype)
            out = batch.run(layer, q, k, v)
            assert isinstance(out, torch.Tensor) and out.shape == q.shape
            for b in range(B):
                want = served[b].attention(layer, q[b:b + 1], k[b:b + 1], v[b:b + 1])
                assert torch.allclose(out[b:b + 1].float(), want.float(), atol=2e-3)
        batch.commit()
        tables = batch.block_tables(0)
        assert tables.shape == (B, batch.max_blocks)
    for b in range(B):
        assert local[b].num_tokens == 9
        for layer in range(L):
            lk, lv = (torch.from_dlpack(t) for t in local[b].get_kv(layer))
            sk, sv = (torch.from_dlpack(t) for t in served[b].get_kv(layer))
            assert torch.equal(lk, sk) and torch.equal(lv, sv)
    assert batch.stats()["steps"] == 9


def test_decode_batch_writes_into_out(client, seed):
    g = torch.Generator().manual_seed(seed)
    caches = [client.allocate(1, 1, 8, "float32") for _ in range(2)]
    batch = client.decode_batch(caches)
    batch.plan()
    q, k, v = (torch.randn(2, 1, 1, 8, generator=g) for _ in range(3))
    out = torch.full((2, 1, 1, 8), float("nan"))
    assert batch.run(0, q, k, v, out=out) is out
    assert not out.isnan().any()
    batch.commit()
    # One token of context: attention returns v itself.
    assert torch.allclose(out, v, atol=1e-6)


def test_page_tables_agree(client, seed):
    caches = [client.allocate(2, 2, 8, "float32", page_size=4, layer_windows=[0, 4])
              for _ in range(3)]
    for i, c in enumerate(caches):
        k = torch.ones(1, 2, 3 + 4 * i, 8)
        c.append(0, k, k)
        c.append(1, k, k)
        c.reserve(1)
    items = [(c, 1) for c in caches]
    for layer in (0, 1):
        vl = kvarena.vllm_block_tables(items, layer, like=torch.empty(0))
        fi = kvarena.flashinfer_page_table(items, layer, like=torch.empty(0))
        assert vl.block_tables.dtype == torch.int32 and vl.slot_mapping.dtype == torch.int64
        for b, c in enumerate(caches):
            table = c.local_table(layer)
            n = int(vl.seq_lens[b])
            assert n == table.written + 1 - table.first_pos
            pages = fi.indices[fi.indptr[b]:fi.indptr[b + 1]].tolist()
            assert pages == vl.block_tables[b, :len(pages)].tolist() == table.page_ids[:len(pages)]
            assert int(vl.slot_mapping[b]) == pages[-1] * 4 + table.written % 4
    raw = kvarena.vllm_block_tables(items, 0)
    assert isinstance(raw.block_tables, kvarena.Tensor)
    assert torch.equal(torch.from_dlpack(raw.block_tables),
                       kvarena.vllm_block_tables(items, 0, like=torch.empty(0)).block_tables)
    for c in caches:
        c.release()


def test_reference_is_sane():
    q = torch.randn(1, 2, 1, 4)
    kv = torch.randn(1, 1, 1, 4)
    assert torch.allclose(reference_attention(q, kv, kv).float(), kv.expand(1, 2, 1, 4))


def test_blocking_call_releases_the_gil():
    """A thread blocked in an RPC (the daemon stopped) lets the others run Python."""
    d = Daemon()
    try:
        client = kvarena.connect(d.address, attach=False, call_timeout=10)
        d.proc.send_signal(signal.SIGSTOP)
        entering, result = threading.Event(), []

        def blocked():
            entering.set()
            try:
                client.stats()
            except kvarena.Error as e:
                result.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        entering.wait()
        # Had the call kept the GIL, this thread could only wake once stats() returned.
        time.sleep(0.2)
        still_blocked = t.is_alive()
        d.proc.send_signal(signal.SIGCONT)
        t.join()
        assert still_blocked
        assert not result  # it completed once the daemon ran again
    finally:
        d.stop()
