#!/usr/bin/env python3
"""A Llama-shaped model decoding greedily three ways through kvarena, in torch.

    PYTHONPATH=build/python python3 python/examples/llama_decode.py [--address unix:/tmp/kvarena.sock]

The model (random weights from a printed seed): token embedding, then per layer RMSNorm,
attention with RoPE and grouped-query heads (one layer with a sliding window), RMSNorm and
a SwiGLU MLP; a final RMSNorm and the LM head. It generates the same tokens three ways:

  torch   its own contiguous per-layer K/V cache, attention in torch;
  served  kvarena's served path: cache.attention(layer, q, k, v) appends and attends in
          the arena;
  local   kvarena's local path: torch writes new K/V into the mapped pool (pool_view) at
          vllm_block_tables' slot_mapping, reads keys through its block_tables and runs
          attention itself; cache.commit(n) ends each step.

and prints tokens/s for each. The local path needs the pool mapped here: "inproc:" or a
unix: address.
"""

import argparse
import math
import random
import sys
import time

import torch

import kvarena


class Config:
    def __init__(self, layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32, vocab=512,
                 ffn=512, window=24, window_layer=1, page_size=16):
        self.layers, self.hidden, self.heads, self.kv_heads = layers, hidden, heads, kv_heads
        self.head_dim, self.vocab, self.ffn = head_dim, vocab, ffn
        self.window, self.window_layer, self.page_size = window, window_layer, page_size

    def layer_windows(self):
        return [self.window if i == self.window_layer else 0 for i in range(self.layers)]


class Model:
    """Weights drawn from torch.Generator(seed); float32, CPU."""

    def __init__(self, cfg, seed):
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        h, hd = cfg.hidden, cfg.head_dim
        self.embed = torch.randn(cfg.vocab, h, generator=g)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append(dict(
                attn_norm=1 + 0.1 * torch.randn(h, generator=g),
                wq=w(h, cfg.heads * hd), wk=w(h, cfg.kv_heads * hd), wv=w(h, cfg.kv_heads * hd),
                wo=w(cfg.heads * hd, h), mlp_norm=1 + 0.1 * torch.randn(h, generator=g),
                w1=w(h, cfg.ffn), w3=w(h, cfg.ffn), w2=w(cfg.ffn, h)))
        self.norm = 1 + 0.1 * torch.randn(h, generator=g)
        self.lm_head = w(h, cfg.vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        self.inv_freq = inv

    @staticmethod
    def rms_norm(x, weight, eps=1e-5):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(self, x, positions):
        """x: [1, heads, T, head_dim]; rotate pairs (even, odd) by position * inv_freq."""
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def forward(self, tokens, start, attend):
        """Logits [T, vocab] of `tokens` at positions start.. ; attend(layer, q, k, v, pos)."""
        cfg = self.cfg
        T = len(tokens)
        positions = torch.arange(start, start + T)
        x = self.embed[torch.tensor(tokens)]
        for i, L in enumerate(self.layers):
            hn = self.rms_norm(x, L["attn_norm"])
            q = (hn @ L["wq"]).view(T, cfg.heads, cfg.head_dim).transpose(0, 1)[None]
            k = (hn @ L["wk"]).view(T, cfg.kv_heads, cfg.head_dim).transpose(0, 1)[None]
            v = (hn @ L["wv"]).view(T, cfg.kv_heads, cfg.head_dim).transpose(0, 1)[None]
            q = self.rope(q, positions).contiguous()
            k = self.rope(k, positions).contiguous()
            v = v.contiguous()
            o = attend(i, q, k, v, positions)  # [1, heads, T, head_dim]
            x = x + o[0].transpose(0, 1).reshape(T, cfg.heads * cfg.head_dim) @ L["wo"]
            hn = self.rms_norm(x, L["mlp_norm"])
            x = x + (torch.nn.functional.silu(hn @ L["w1"]) * (hn @ L["w3"])) @ L["w2"]
        return self.rms_norm(x, self.norm) @ self.lm_head


def attend_torch(q, keys, values, q_pos, k_pos, window):
    """Causal (and windowed: keys in (p - window, p]) GQA attention in torch.

    q: [1, H, T, D]; keys/values: [S, KVH, D] at absolute positions k_pos [S]."""
    H, KVH, D = q.shape[1], keys.shape[1], q.shape[3]
    k = keys.permute(1, 0, 2).repeat_interleave(H // KVH, dim=0)  # [H, S, D]
    v = values.permute(1, 0, 2).repeat_interleave(H // KVH, dim=0)
    scores = (q[0] @ k.transpose(1, 2)) / math.sqrt(D)  # [H, T, S]
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return (scores.softmax(-1) @ v)[None]


class TorchCache:
    """(a) The model's own contiguous K/V cache."""

    def __init__(self, cfg):
        self.cfg, self.k, self.v, self.pos = cfg, [None] * cfg.layers, [None] * cfg.layers, None

    def attend(self, layer, q, k, v, positions):
        kt, vt = k[0].transpose(0, 1), v[0].transpose(0, 1)  # [T, KVH, D]
        self.k[layer] = kt if self.k[layer] is None else torch.cat([self.k[layer], kt])
        self.v[layer] = vt if self.v[layer] is None else torch.cat([self.v[layer], vt])
        k_pos = torch.arange(self.k[layer].shape[0])
        return attend_torch(q, self.k[layer], self.v[layer], positions, k_pos,
                            self.cfg.layer_windows()[layer])

    def step_begin(self, n):
        pass

    def step_end(self, n):
        pass


class ServedCache:
    """(b) kvarena's served path: the arena appends and attends."""

    def __init__(self, cache):
        self.cache = cache

    def attend(self, layer, q, k, v, positions):
        return self.cache.attention(layer, q, k, v)

    def step_begin(self, n):
        pass

    def step_end(self, n):
        pass


class LocalCache:
    """(c) kvarena's local path: torch writes and reads the mapped pool itself."""

    def __init__(self, cache, cfg):
        self.cache, self.cfg = cache, cfg
        self.pool = torch.from_dlpack(cache.pool_view())  # [pages, 2, page_size, KVH, D]

    def step_begin(self, n):
        self.cache.reserve(n)
        self.n = n

    def attend(self, layer, q, k, v, positions):
        ps = self.cfg.page_size
        t = kvarena.vllm_block_tables([(self.cache, self.n)], layer, like=q)
        slots = t.slot_mapping
        page, off = slots // ps, slots % ps
        dev = self.pool.device  # a CUDA pool (kDLCUDA view) with a CUDA torch: index there
        page, off = page.to(dev), off.to(dev)
        self.pool[page, 0, off] = k[0].transpose(0, 1).to(dev)  # new K, [T, KVH, D]
        self.pool[page, 1, off] = v[0].transpose(0, 1).to(dev)
        seq_len, first = int(t.seq_lens[0]), int(t.first_pos[0])
        blocks = t.block_tables[0, : (seq_len + ps - 1) // ps].long().to(dev)
        shape = (-1, self.cfg.kv_heads, self.cfg.head_dim)
        keys = self.pool[blocks, 0].reshape(shape)[:seq_len].to(q.device)
        values = self.pool[blocks, 1].reshape(shape)[:seq_len].to(q.device)
        k_pos = torch.arange(first, first + seq_len)
        return attend_torch(q, keys, values, positions, k_pos, self.cfg.layer_windows()[layer])

    def step_end(self, n):
        self.cache.commit(n)


def generate(model, kv, prompt, new_tokens, start=0):
    """Greedy decode: returns (tokens generated, logits of each step [new_tokens, vocab])."""
    out, logits_seen = [], []
    tokens, pos = list(prompt[start:]), start
    for _ in range(new_tokens):
        kv.step_begin(len(tokens))
        logits = model.forward(tokens, pos, kv.attend)[-1]
        kv.step_end(len(tokens))
        pos += len(tokens)
        nxt = int(logits.argmax())
        out.append(nxt)
        logits_seen.append(logits)
        tokens = [nxt]
    return out, torch.stack(logits_seen)


def allocate(client, cfg, **kw):
    return client.allocate(cfg.layers, cfg.kv_heads, cfg.head_dim, "float32",
                           page_size=cfg.page_size, layer_windows=cfg.layer_windows(), **kw)


def run_three_ways(client, cfg, seed, prompt_len, new_tokens, log=print):
    """Generates three ways; returns {mode: (tokens, logits, tokens_per_s)}."""
    model = Model(cfg, seed)
    rng = random.Random(seed)
    prompt = [rng.randrange(cfg.vocab) for _ in range(prompt_len)]
    results = {}
    for mode in ("torch", "served", "local"):
        cache = None
        if mode == "torch":
            kv = TorchCache(cfg)
        else:
            cache = allocate(client, cfg)
            if mode == "local" and cache.device != "cpu" and not torch.cuda.is_available():
                log(f"{mode:>6}: skipped: the pool is on {cache.device} and this torch has no CUDA")
                cache.release()
                continue
            kv = ServedCache(cache) if mode == "served" else LocalCache(cache, cfg)
        t0 = time.perf_counter()
        toks, logits = generate(model, kv, prompt, new_tokens)
        dt = time.perf_counter() - t0
        results[mode] = (toks, logits, (prompt_len + new_tokens - 1) / dt)
        if cache is not None:
            cache.release()
        log(f"{mode:>6}: {results[mode][2]:8.1f} tokens/s  tokens {toks[:8]}...")
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default="inproc:")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--head_dim", type=int, default=32)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--window", type=int, default=24)
    p.add_argument("--page_size", type=int, default=16)
    p.add_argument("--prompt_len", type=int, default=20)
    p.add_argument("--new_tokens", type=int, default=40)
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    print(f"llama_decode: seed {seed} (--seed={seed} repeats this run), address {a.address}")
    torch.manual_seed(seed)
    cfg = Config(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                 head_dim=a.head_dim, vocab=a.vocab, ffn=2 * a.hidden, window=a.window,
                 page_size=a.page_size)
    client = kvarena.connect(a.address, client_name="llama_decode")
    with torch.no_grad():
        r = run_three_ways(client, cfg, seed, a.prompt_len, a.new_tokens)
    modes = [m for m in ("served", "local") if m in r]
    same = all(r[m][0] == r["torch"][0] for m in modes)
    diff = max(float((r[m][1] - r["torch"][1]).abs().max()) for m in modes)
    print(f"llama_decode: {' and '.join(['torch'] + modes)} {'agree' if same else 'DIFFER'} on "
          f"{a.new_tokens} tokens; largest logit difference from torch {diff:.2e}")
    return 0 if same and diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
