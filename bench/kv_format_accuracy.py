#!/usr/bin/env python3
"""How much a quantized KV format changes a model's output, measured (issue 36, item 4).

    PYTHONPATH=build/python /usr/bin/python3 bench/kv_format_accuracy.py [--steps 512]

Model level: python/examples/llama_decode.py's model (random weights from a printed seed,
its LM head scaled by --logit_scale so the next-token distribution is not flat: the mean
entropy is printed) decodes through kvarena's served path. A float16 cache generates the
tokens; every other cache is fed the same tokens (teacher forcing), and at each step the
next-token distribution is compared with the float16 cache's: mean KL divergence
KL(p_f16 || p_format) and top-1 agreement. A float32 cache is the reference for the float16
one, so the 16-bit cache's own error is on the same table. fp8_e4m3 runs with the default
static scales (1) and with calibrated ones: per (layer, kv head) max|K| / 448 and max|V| / 448
over the prompt's prefill only (a calibration set apart from the tokens measured).

Retrieval: at --context tokens (16k by default) of random keys, one key made to match the
query and given its own value; attention must return that value (cosine similarity of the
output with the planted value, and with the mean of the others).
"""

import argparse
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "examples"))
import llama_decode  # noqa: E402

import kvarena  # noqa: E402


class FormatCache:
    """The served path with activations in `dtype` and pages in `kv_format`; the model
    computes in float32 and converts at the call."""

    def __init__(self, client, cfg, dtype, kv_format, scales=(None, None)):
        self.dtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
        self.cache = client.allocate(cfg.layers, cfg.kv_heads, cfg.head_dim, dtype,
                                     page_size=cfg.page_size, layer_windows=cfg.layer_windows(),
                                     kv_format=kv_format, k_scales=scales[0], v_scales=scales[1])
        self.amax = None  # with record(): per layer, max |K| and |V| per kv head

    def record(self, cfg):
        self.amax = [[torch.zeros(cfg.kv_heads), torch.zeros(cfg.kv_heads)]
                     for _ in range(cfg.layers)]

    def attend(self, layer, q, k, v, positions):
        if self.amax is not None:
            for i, x in enumerate((k, v)):
                seen = x.float().abs().amax(dim=(0, 2, 3))
                self.amax[layer][i] = torch.maximum(self.amax[layer][i], seen)
        out = self.cache.attention(layer, q.to(self.dtype), k.to(self.dtype), v.to(self.dtype))
        return torch.from_dlpack(out).to(torch.float32)

    def step_begin(self, n):
        pass

    def step_end(self, n):
        pass


def forced_logits(model, kv, tokens, prompt_len):
    """Logits of each decode step [len(tokens) - prompt_len, vocab]: the prompt at once,
    then the given tokens one at a time."""
    out = [model.forward(tokens[:prompt_len], 0, kv.attend)[-1]]
    for pos in range(prompt_len, len(tokens) - 1):
        out.append(model.forward([tokens[pos]], pos, kv.attend)[-1])
    return torch.stack(out)


def compare(ref, got):
    """(mean KL(ref || got), top-1 agreement) over the steps."""
    lp, lq = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean()
    return float(kl.mean()), float(top1)


def retrieval(client, kv_format, context, head_dim, seed):
    """Cosine similarity of attention's output with the planted value and with the others'
    mean, for one query over `context` random keys, one of them made to match it."""
    g = torch.Generator().manual_seed(seed)
    cache = client.allocate(1, 1, head_dim, "float16", page_size=16, kv_format=kv_format)
    q = torch.randn(1, 1, 1, head_dim, generator=g)
    keys = torch.randn(1, 1, context, head_dim, generator=g) * 0.5
    values = torch.randn(1, 1, context, head_dim, generator=g)
    at = context // 3
    keys[0, 0, at] = q[0, 0, 0] * 4  # a score of 4 |q|^2 / sqrt(D) against about N(0, |q|/2)
    chunk = 4096
    for s in range(0, context - 1, chunk):
        e = min(s + chunk, context - 1)
        cache.append(0, keys[:, :, s:e].half().contiguous(), values[:, :, s:e].half().contiguous())
    out = cache.attention(0, q.half(), keys[:, :, -1:].half().contiguous(),
                          values[:, :, -1:].half().contiguous())
    o = torch.from_dlpack(out).float()[0, 0, 0]
    cache.release()
    cos = torch.nn.functional.cosine_similarity
    others = torch.cat([values[0, 0, :at], values[0, 0, at + 1:]]).mean(0)
    return float(cos(o, values[0, 0, at], dim=0)), float(cos(o, others, dim=0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default="inproc:")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=512)
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--logit_scale", type=float, default=6.0)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--head_dim", type=int, default=32,
                   help="with --head_dim 64 the int8 rows run the VNNI kernels where the CPU "
                        "has them (q quantized per row); KVARENA_CPU_KERNELS=avx512 turns them off")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    print(f"kv_format_accuracy: seed {seed} (--seed={seed} repeats it), address {a.address}")
    torch.manual_seed(seed)
    client = kvarena.connect(a.address, client_name="kv_format_accuracy")
    cfg = llama_decode.Config(page_size=16, head_dim=a.head_dim, heads=256 // a.head_dim)
    model = llama_decode.Model(cfg, seed)
    model.lm_head *= a.logit_scale
    rng = random.Random(seed)
    prompt = [rng.randrange(cfg.vocab) for _ in range(a.prompt_len)]
    with torch.no_grad():
        kv = FormatCache(client, cfg, "float16", None)
        tokens, _ = llama_decode.generate(model, kv, prompt, a.steps)
        kv.cache.release()
        tokens = prompt + tokens
        kv = FormatCache(client, cfg, "float32", None)  # calibration: the prompt's prefill
        kv.record(cfg)
        model.forward(prompt, 0, kv.attend)
        kv.cache.release()
        calibrated = tuple([float(x) / 448 for layer in kv.amax for x in layer[i]] for i in (0, 1))
        # label: (activation dtype, KV format, static scales)
        caches = {"float32": ("float32", None, (None, None)),
                  "float16": ("float16", None, (None, None)),
                  "int8": ("float16", "int8", (None, None)),
                  "int8 f32": ("float32", "int8", (None, None)),
                  "fp8 scale 1": ("float16", "fp8_e4m3", (None, None)),
                  "fp8 calibrated": ("float16", "fp8_e4m3", calibrated)}
        logits = {}
        for label, (dtype, fmt, scales) in caches.items():
            kv = FormatCache(client, cfg, dtype, fmt, scales)
            logits[label] = forced_logits(model, kv, tokens, a.prompt_len)
            kv.cache.release()
    ref = logits["float16"]
    ent = float(-(ref.log_softmax(-1).exp() * ref.log_softmax(-1)).sum(-1).mean())
    print(f"model: {cfg.layers} layers, {cfg.heads} q / {cfg.kv_heads} kv heads, head_dim "
          f"{cfg.head_dim}, vocab {cfg.vocab}; {a.steps} decode steps after a {a.prompt_len}-token "
          f"prompt; mean next-token entropy {ent:.2f} nats (uniform: {math.log(cfg.vocab):.2f})")
    print(f"CPU kernels: {os.environ.get('KVARENA_CPU_KERNELS') or 'the best the CPU has'}")
    print(f"{'activations':>11} {'cache':>15} {'against':>16} {'mean KLD':>10} {'top-1':>7}")
    rows = [("float16", "float32"), ("int8", "float16"), ("int8 f32", "float32"),
            ("fp8 scale 1", "float16"), ("fp8 calibrated", "float16")]
    for got, against in rows:
        kl, top1 = compare(logits[against], logits[got])
        print(f"{caches[got][0]:>11} {got:>15} {against + ' pages':>16} "
              f"{kl:10.2e} {100 * top1:6.2f}%")
    print("calibrated fp8 scales: K " + ", ".join(f"{x:.3g}" for x in calibrated[0][:4]) +
          " ...; V " + ", ".join(f"{x:.3g}" for x in calibrated[1][:4]) + " ...")
    print(f"retrieval at {a.context} tokens (head_dim 64): cosine of the output with the planted "
          f"value / with the others' mean")
    for fmt in (None, "int8", "fp8_e4m3"):
        hit, rest = retrieval(client, fmt, a.context, 64, seed)
        print(f"{fmt or 'float16':>9}: {hit:.4f} / {rest:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
