"""A Python worker process for the multi-process tests (run as a script).

    worker.py ADDRESS prefix SEED PROMPT_LEN NEW_TOKENS   # generate with prefix reuse,
        print one JSON line: {"cached_tokens": .., "tokens": [..]}
    worker.py ADDRESS hold                                # allocate and write, print
        "ready", then sleep until killed
"""

import json
import pathlib
import random
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import kvarena  # noqa: E402
import llama_decode  # noqa: E402


def prefix_config():
    return llama_decode.Config(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=89,
                               ffn=128, window=0, window_layer=-1, page_size=4)


def generate_with_prefix(address, seed, prompt_len, new_tokens):
    cfg = prefix_config()
    model = llama_decode.Model(cfg, seed)
    rng = random.Random(seed)
    prompt = [rng.randrange(cfg.vocab) for _ in range(prompt_len)]
    client = kvarena.connect(address, client_name="prefix-worker")
    cache = llama_decode.allocate(client, cfg, prefix_namespace=f"llama-{seed}",
                                  prompt_tokens=prompt)
    start = cache.cached_tokens
    with torch.no_grad():
        toks, _ = llama_decode.generate(model, llama_decode.ServedCache(cache), prompt,
                                        new_tokens, start=start)
    cache.release()  # its full pages stay cached for the next worker
    print(json.dumps({"cached_tokens": start, "tokens": toks}), flush=True)


def hold(address):
    client = kvarena.connect(address, client_name="doomed-worker")
    cache = client.allocate(2, 2, 16, "float32", page_size=4)
    k = torch.ones(1, 2, 10, 16)
    for layer in range(2):
        cache.append(layer, k, k)
    cache.reserve(7)
    pool = torch.from_dlpack(cache.pool_view())
    print("ready", cache.cache_id, int(pool.shape[0]), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    address, what = sys.argv[1], sys.argv[2]
    if what == "prefix":
        generate_with_prefix(address, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        hold(address)
