#!/usr/bin/env python3
"""The batched local path driven from Python, against the C++ decode_loop_bench's (d) row.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_decode.py [--steps 32] [--build build]

Shape (decode_loop_bench's): batch 8, 32 layers, 8 kv / 32 q heads, head_dim 128, float16,
page 16, context 2048 growing by --steps. Runs build/bench/decode_loop_bench --steps=N
(its own kvarenad) and parses its (d) row, then starts a kvarenad of its own and runs the
same loop through the kvarena module (once before the C++ run and once after, averaged):
per step decode_batch.plan(), run(layer, q, k, v,
out=out) for each layer with torch tensors, commit(). Prints both rows, the tokens/s
ratio (Python / C++) and the binding's cost per layer call in µs two ways: the difference
of the two ms/step over the 32 layer calls of a step (on a loaded machine, noise swamps
it), and the time of one run() call on a shape whose kernel costs next to nothing (an
upper bound).
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

BATCH, LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, CONTEXT, PAGE = 8, 32, 8, 32, 128, 2048, 16


def cpp_row(build, steps):
    out = subprocess.run([str(build / "bench" / "decode_loop_bench"), f"--steps={steps}",
                          f"--kvarenad={build / 'daemon' / 'kvarenad'}"],
                         check=True, capture_output=True, text=True).stdout
    print(out, end="")
    m = re.search(r"^\(d\).*?\s([\d.]+)\s+([\d.]+)\s+d/a", out, re.M)
    if not m:
        sys.exit("python_decode: no (d) row in decode_loop_bench's output")
    return float(m.group(1)), float(m.group(2))


def python_row(build, steps):
    import kvarena
    tmp = tempfile.mkdtemp(prefix="kvarena-pybench-")
    sock = f"unix:{tmp}/kvarena.sock"
    daemon = subprocess.Popen([str(build / "daemon" / "kvarenad"), f"--listen={sock}",
                               "--backend=host", "--arena_bytes=4Gi", f"--page_size={PAGE}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                client = kvarena.connect(sock, client_name="python_decode")
                break
            except kvarena.Unavailable:
                time.sleep(0.05)
        else:
            sys.exit("python_decode: kvarenad did not start")
        g = torch.Generator().manual_seed(1)
        caches = [client.allocate(LAYERS, KV_HEADS, HEAD_DIM, torch.float16) for _ in range(BATCH)]
        client.reserve([(c, CONTEXT) for c in caches])
        pk = torch.randn(1, KV_HEADS, CONTEXT, HEAD_DIM, generator=g).half()
        pv = torch.randn(1, KV_HEADS, CONTEXT, HEAD_DIM, generator=g).half()
        for c in caches:
            for layer in range(LAYERS):
                c.append_local(layer, pk, pv)
        client.commit([(c, CONTEXT) for c in caches])
        batch = client.decode_batch(caches)
        sets = [tuple(torch.randn(BATCH, h, 1, HEAD_DIM, generator=g).half()
                      for h in (Q_HEADS, KV_HEADS, KV_HEADS)) for _ in range(16)]
        out = torch.empty(BATCH, Q_HEADS, 1, HEAD_DIM, dtype=torch.float16)
        start = time.perf_counter()
        for _ in range(steps):
            batch.plan()
            for layer in range(LAYERS):
                q, k, v = sets[layer % len(sets)]
                batch.run(layer, q, k, v, out=out)
            batch.commit()
        seconds = time.perf_counter() - start
        for c in caches:
            c.release()
        return BATCH * steps / seconds, 1000 * seconds / steps, tiny_call_us(client)
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def tiny_call_us(client, steps=20, layers=64):
    """µs per decode_batch.run on a shape whose kernel costs next to nothing (1 sequence,
    1 kv head, head_dim 8, short context): an upper bound of the binding's own cost per
    layer call (DLPack parsing of q/k/v/out, the GIL released once, the checks)."""
    import kvarena  # noqa: F401
    cache = client.allocate(layers, 1, 8, torch.float16)
    batch = client.decode_batch([cache])
    q, k, v, out = (torch.zeros(1, 1, 1, 8, dtype=torch.float16) for _ in range(4))
    total = 0.0
    for _ in range(steps):
        batch.plan()
        start = time.perf_counter()
        for layer in range(layers):
            batch.run(layer, q, k, v, out=out)
        total += time.perf_counter() - start
        batch.commit()
    cache.release()
    return 1e6 * total / (steps * layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--build", default=os.environ.get("BUILD_DIR", "build"))
    a = p.parse_args()
    build = pathlib.Path(a.build).resolve()
    # Python, C++, Python: load that comes and goes on a shared machine weighs on both alike.
    first = python_row(build, a.steps)
    cpp_tps, cpp_ms = cpp_row(build, a.steps)
    second = python_row(build, a.steps)
    py_ms = (first[1] + second[1]) / 2
    py_tps = BATCH * 1000 / py_ms
    print(f"python runs: {first[1]:.2f} and {second[1]:.2f} ms/step; a run() call on a tiny "
          f"shape: {first[2]:.1f} and {second[2]:.1f} us")
    print(f"{'way':<58} {'tokens/s':>10} {'ms/step':>9}")
    print(f"{'(d) C++ DecodeBatch (decode_loop_bench)':<58} {cpp_tps:10.1f} {cpp_ms:9.2f}")
    print(f"{'(d) Python: kvarena decode_batch, torch tensors':<58} {py_tps:10.1f} {py_ms:9.2f}")
    print(f"python/C++ tokens/s ratio {py_tps / cpp_tps:.3f}; binding cost per layer call: "
          f"{1000 * (py_ms - cpp_ms) / LAYERS:.1f} us from the two ms/step (noise included), "
          f"at most {min(first[2], second[2]):.1f} us from a tiny-shape run() "
          f"({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
