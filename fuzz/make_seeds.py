#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/requests_fuzzer.cc and fuzz/fd_fuzzer.cc.

requests_fuzzer: short programs in its input format (see the comment at the top of that
file) that walk the paths a worker takes — allocate, append, attend, popn, the local
path's reserve/commit, shared slices, sessions that detach and are reaped — so the fuzzer
starts from requests that get deep into the store.
fd_fuzzer: framed FdRequests (a 4-byte little-endian length, then the message, encoded by
hand below) naming the placeholder sessions "s0" / "s1".
Run from the repository root: python3 fuzz/make_seeds.py"""
import os
import struct

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")
OPS = {"allocate": 0, "append": 1, "attend": 2, "popn": 3, "reset": 4, "release": 5,
       "reserve": 6, "commit": 7, "get_kv": 8, "describe": 9, "stats": 10,
       "open_session": 11, "detach": 12, "reap": 13, "list": 14,
       "allocate_prompt": 240, "set_tokens": 241, "fork": 242,
       # tier mode only (an input starting with TIER_MODE: fuzz/requests_tiers.h)
       "tier_flush": 243, "tier_corrupt": 244, "tier_pressure": 245}
TIER_MODE = 0xFF
METADATA_MODE = 0xFE  # metadata pressure: fuzz/requests_fuzzer.cc's Harness
ALPHA, BETA = 0x40, 0x80  # the caller's tenant, in the session byte's top bits
IDS = {"a": 0, "b": 1, "c": 2, "d": 3}
F32, F16, BF16 = 1, 2, 3
NO_SESSION = 0  # with no session open, index 0 is "" (sessions + 0)


def u8(v):
    return bytes([v & 0xFF])


def integer(v, width, small):
    if 0 <= v <= small and v < 32:
        return u8(v)
    return u8(200) + struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)[:width]


def u32(v, small=3):
    return integer(v, 4, small)


def u64(v, small=40):
    return integer(v, 8, small)


def i64(v, small=3):
    return integer(v, 8, small)


def step(op, session=NO_SESSION):
    return u8(OPS[op]) + u8(session)


def cache(name):
    return u8(IDS[name])


def tensor(dtype, heads, tokens, dim, seed=1):
    out = u8(dtype) + u8(4)
    for d, small in ((1, 3), (heads, 3), (tokens, 3), (dim, 8)):
        out += i64(d, small)
    return out + u8(2) + u8(seed)  # exactly the shape's bytes


def spec(layers=2, kv=2, dim=8, dtype=F32, page=4, windows=(), max_tokens=None):
    out = u32(layers) + u32(kv) + u32(dim, 8) + u8(dtype) + u32(page, 5) + u8(len(windows))
    for w in windows:
        out += u32(w, 9)
    return out + (u8(1) + u64(max_tokens) if max_tokens is not None else u8(0))


def allocate(name, session=NO_SESSION, **kw):
    return step("allocate", session) + spec(**kw) + cache(name)


def token_ids(ids):
    out = u8(len(ids))
    for v in ids:
        out += u8(v) if 0 <= v <= 3 else u8(200) + struct.pack("<i", v)
    return out


def allocate_prompt(name, prompt, namespace=1, session=NO_SESSION, **kw):  # namespace 1: "m"
    return step("allocate_prompt", session) + spec(**kw) + u8(namespace) + cache(name) + token_ids(prompt)


def set_tokens(name, first_pos, ids, session=NO_SESSION):
    return step("set_tokens", session) + cache(name) + u64(first_pos) + token_ids(ids)


def fork(name, new_name, session=NO_SESSION):
    return step("fork", session) + cache(name) + cache(new_name)


def append(name, layer, pos, tokens, session=NO_SESSION, kv=2, dim=8, dtype=F32):
    return (step("append", session) + cache(name) + u32(layer) + u64(pos) +
            tensor(dtype, kv, tokens, dim, seed=pos + 1) + u8(1))


def attend(name, layer, pos, tokens, q_heads=4, with_kv=False, window=0, session=NO_SESSION):
    out = step("attend", session) + cache(name) + u32(layer) + u64(pos) + tensor(F32, q_heads, tokens, 8, 3)
    out += u8(3 if with_kv else 0)
    if with_kv:
        out += tensor(F32, 2, tokens, 8, 4) + tensor(F32, 2, tokens, 8, 5)
    return out + u32(window, 9)


def tiered(config, program):  # config: fuzz/requests_tiers.h's configuration byte
    return u8(TIER_MODE) + u8(config) + program


def corrupt(which, at, mask=1):  # mask 0: the disk store starts (or stops) failing
    return step("tier_corrupt") + u8(which) + u64(at, 255) + u8(mask)


def computed(name, prompt, **kw):  # a prompt allocated and its K/V appended on both layers
    n = len(prompt)
    return allocate_prompt(name, prompt, **kw) + append(name, 0, 0, n) + append(name, 1, 0, n)


def items(op, pairs, session=NO_SESSION):
    out = step(op, session) + u8(len(pairs))
    for name, n in pairs:
        out += cache(name) + u64(n, 20)
    return out


SMALL_PROMPT = [1, 2, 3, 0, 1, 2, 3, 1, 0, 0, 2, 1, 3, 3, 0, 2, 1]  # 4 full pages of 4, and one token


def round_prompt(r):  # 5 full pages of 4 that no other round's first page matches
    return [1000 + r] + SMALL_PROMPT[:19] + [r % 4]


def metadata_rounds(count):  # computed prompts, each released: cached prefixes pile up
    out = b""
    for r in range(count):
        name = "abcd"[r % 4]
        out += computed(name, round_prompt(r)) + step("release") + cache(name)
    return out


def wide(session, slot):  # a cache of 20 layers: about 1.3 KB of metadata
    return step("allocate", session) + spec(layers=20) + u8(slot)

SEEDS = {
    "served_path": allocate("a", windows=(0, 3)) + append("a", 0, 0, 5) + append("a", 1, 0, 5) +
        attend("a", 0, 3, 2) + attend("a", 1, 5, 1, with_kv=True) + attend("a", 1, 4, 1, window=2) +
        step("popn") + cache("a") + u64(2, 8) + step("get_kv") + cache("a") + u32(0) + u64(0) + u64(0) +
        step("describe") + cache("a") + step("reset") + cache("a") + u8(1) + append("a", 0, 0, 3) +
        step("release") + cache("a"),
    "local_path": allocate("b", layers=3, windows=(0, 5, 0)) + items("reserve", [("b", 9)]) +
        items("commit", [("b", 9)]) + items("reserve", [("b", 20)]) + items("commit", [("b", 7)]) +
        step("get_kv") + cache("b") + u32(1) + u64(0) + u64(0) + step("popn") + cache("b") + u64(3, 8),
    "many_caches": allocate("a") + allocate("b", dtype=F16) + allocate("c", page=1) +
        allocate("d", dim=4, kv=1) + append("a", 0, 0, 17) + append("b", 0, 0, 3, dtype=F16) +
        items("reserve", [("a", 3), ("b", 5), ("c", 2)]) + items("commit", [("c", 2)]) +
        step("stats") + u8(0) + step("list") + step("release") + cache("b") + step("release") + cache("c"),
    "sessions": step("open_session") + u8(2) + b"w1" + step("open_session", 1) + u8(2) + b"w2" +
        allocate("a", session=0) + allocate("b", session=1) + append("a", 0, 0, 4, session=0) +
        append("a", 0, 4, 1, session=1) + step("detach", 0) + u8(3) + step("reap") + u8(5) +
        allocate("a", session=1) + step("reap") + u8(30),
    "max_tokens": allocate("a", max_tokens=6) + append("a", 0, 0, 4) + append("a", 0, 4, 4) +
        items("reserve", [("a", 3)]) + append("a", 1, 0, 6),
    "shared_slices": step("open_session") + u8(1) + b"s" + allocate("a", session=0) +
        step("append", 0) + cache("a") + u32(0) + u64(0) +
        u8(F32) + u8(4) + i64(1) + i64(2) + i64(2) + i64(8, 8) + u8(0) + u8(0) + u64(0, 255) + u64(0, 255) +
        u8(1),
    # Prefix reuse: b adopts a's first two pages, declared tokens register a's answer, a
    # fork shares and copies, popn cuts into shared pages, released pages stay cached.
    "prefix": allocate_prompt("a", list(range(10, 20))) + append("a", 0, 0, 10) + append("a", 1, 0, 10) +
        allocate_prompt("b", list(range(10, 20))) + append("b", 0, 8, 2) + append("b", 1, 8, 2) +
        set_tokens("a", 10, [7, 8]) + append("a", 0, 10, 2) + append("a", 1, 10, 2) + fork("a", "c") +
        step("popn") + cache("c") + u64(7, 8) + step("popn") + cache("b") + u64(1, 8) +
        step("release") + cache("a") + allocate_prompt("d", list(range(10, 20)) + [7, 8, 9]) +
        step("reset") + cache("d") + u8(1) + step("release") + cache("b") + step("stats") + u8(0),
    "prefix_sliding": allocate_prompt("a", [], windows=(0, 3)) + append("a", 0, 0, 9) + append("a", 1, 0, 9) +
        append("a", 1, 9, 1) + set_tokens("a", 0, list(range(40, 50))) + append("a", 0, 9, 1) +
        allocate_prompt("b", list(range(40, 51)), windows=(0, 3)) + fork("b", "c") +
        items("reserve", [("b", 3), ("c", 2)]) + items("commit", [("b", 3)]),
    # Tiers: a computed prompt's pages go down when pressure trims the arena (4 one-page
    # chunks: the host's 4 KiB keeps three, the oldest goes to the disk), come back into
    # b, then the disk's value is flipped (a corrupt miss) and the disk fails (an error).
    "tiers_write_back": tiered(0x00, computed("a", SMALL_PROMPT) + step("release") + cache("a") +
        step("tier_pressure") + step("tier_flush") + allocate_prompt("b", SMALL_PROMPT) +
        append("b", 0, 16, 1) + append("b", 1, 16, 1) + step("get_kv") + cache("b") + u32(1) + u64(0) + u64(0) +
        step("release") + cache("b") + step("tier_pressure") + step("tier_flush") + corrupt(0, 300) +
        corrupt(1, 40, 0x80) + corrupt(2, 1000) + corrupt(3, 7) +
        allocate_prompt("c", SMALL_PROMPT) + step("release") + cache("c") + step("tier_pressure") +
        corrupt(0, 0, 0) + allocate_prompt("d", SMALL_PROMPT) + corrupt(0, 0, 0) + step("stats") + u8(0)),
    # Write-through, chunks of 2 pages: full chunks go down as they fill; a second prompt
    # shares the first chunk and diverges in the second; SetTokens declares an answer.
    "tiers_write_through": tiered(0x03, computed("a", SMALL_PROMPT) + step("tier_flush") + step("release") +
        cache("a") + step("tier_pressure") + allocate_prompt("b", SMALL_PROMPT[:8] + [0, 0, 0, 0, 1]) +
        set_tokens("b", 8, [3, 3, 3, 3]) + fork("b", "c") + step("tier_pressure") + step("tier_flush") +
        allocate_prompt("d", SMALL_PROMPT, windows=(0, 3))),
    # The disk takes every full chunk (as the cluster tier does), the host the evicted ones:
    # a chunk is in both; the host's copy is found first, a corrupt disk copy only after
    # the host let it go.
    "tiers_disk_write_through": tiered(0x11, computed("a", SMALL_PROMPT) + step("tier_flush") +
        corrupt(0, 500) + corrupt(1, 64) + step("release") + cache("a") + step("tier_pressure") +
        step("tier_flush") + allocate_prompt("b", SMALL_PROMPT) + computed("c", SMALL_PROMPT[::-1]) +
        step("release") + cache("b") + step("release") + cache("c") + step("tier_pressure") +
        step("tier_flush") + allocate_prompt("d", SMALL_PROMPT) + allocate_prompt("a", SMALL_PROMPT[::-1])),
    # Metadata pressure: 60 rounds of released prompts fill the budget with cached
    # prefixes; the later rounds' charges take it back from the oldest, and a prompt
    # of the newest still hits.
    "metadata_pressure": u8(METADATA_MODE) + metadata_rounds(60) + allocate_prompt("a", round_prompt(59)) +
        step("stats") + u8(0),
    # Beta's 2 KiB share stops its second wide cache; alpha and the callers without a
    # tenant are served.
    "tenant_metadata": b"".join(wide(BETA, i) for i in (0, 1, 4)) + wide(ALPHA, 2) +
        wide(NO_SESSION, 1) + step("stats") + u8(0),
    # A 4 KiB write queue drops writes; a sliding layer sends down only its window's pages.
    "tiers_small_queue": tiered(0x25, computed("a", SMALL_PROMPT, windows=(0, 5)) + computed("c", SMALL_PROMPT[::-1]) +
        step("release") + cache("a") + step("release") + cache("c") + step("tier_pressure") + step("tier_flush") +
        allocate_prompt("b", SMALL_PROMPT, windows=(0, 5)) + allocate_prompt("d", SMALL_PROMPT[::-1])),
}


# --- fd_fuzzer: protobuf by hand (field = key varint, then a varint or a length and bytes)

def varint(v):
    out = b""
    while True:
        low, v = v & 0x7F, v >> 7
        if not v:
            return out + bytes([low])
        out += bytes([low | 0x80])


def field(number, payload, length_delimited=True):
    key = varint((number << 3) | (2 if length_delimited else 0))
    return key + (varint(len(payload)) + payload if length_delimited else payload)


def frame(message):
    return struct.pack("<I", len(message)) + message


def fd_request(session, op):  # FdRequest{session_id = 1, list_regions = 2 | export_region = 3}
    return frame(field(1, session.encode()) + op)


LIST = field(2, b"")


def export(region, first=None, after=None):  # ExportRegion{region_id, first_piece, after_generation}
    body = field(1, varint(region), False)
    if first is not None:
        body += field(2, varint(first), False)
    if after is not None:
        body += field(3, varint(after), False)
    return field(3, body)


ALLOWED, OTHER_USER = b"\0", b"\1"  # the first byte: whether the peer passed SO_PEERCRED
FD_SEEDS = {
    "list": ALLOWED + fd_request("s0", LIST),
    "export_pool": ALLOWED + fd_request("s0", export(1)) + fd_request("s0", export(1, after=1)),
    "export_scratch": ALLOWED + fd_request("s0", export(1 << 32)) + fd_request("s1", export(1 << 32)),
    "paging": ALLOWED + fd_request("s1", export(1, first=1)) + fd_request("s1", export(7, first=2**31)),
    "other_user": OTHER_USER + fd_request("s0", LIST),
    "truncated": ALLOWED + struct.pack("<I", 1000) + b"abc",
}


def write(target, seeds):
    out = os.path.join(CORPUS, target)
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out}")


def main():
    write("requests_fuzzer", SEEDS)
    write("fd_fuzzer", FD_SEEDS)


if __name__ == "__main__":
    main()
