"""kvarena: a Python worker's client of the KV arena (kvarenad), with no framework linked.

    import kvarena, torch
    client = kvarena.connect("unix:/tmp/kvarena.sock")
    cache = client.allocate(num_layers=2, num_kv_heads=8, head_dim=128, dtype=torch.float16)
    out = cache.attention(0, q, k, v)          # q/k/v: [1, heads, tokens, head_dim]

Tensors cross through DLPack (``__dlpack__``) or the buffer protocol; every tensor a call
returns supports ``__dlpack__`` (``torch.from_dlpack(x)`` takes it without a copy), and a
call that took tensors returns the same library's type. The API mirrors the C++ client
(client/include/kvarena/) in snake_case; docs/python.md is the guide.
"""

from ._errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                      FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                      PermissionDenied, ResourceExhausted, StatusCode, Unauthenticated,
                      Unavailable, Unimplemented, Unknown)
from ._kvarena import (Cache, Client, DecodeBatch, Tensor, flashinfer_page_table,
                       vllm_block_tables)

DEFAULT_ADDRESS = "unix:/tmp/kvarena.sock"
INPROC_ADDRESS = "inproc:"


def connect(address=DEFAULT_ADDRESS, **options):
    """A Client of the arena at ``address`` ("unix:PATH", "HOST:PORT" or "inproc:").

    ``options`` are ``kvarena::ClientOptions``' fields (client_name, call_timeout,
    connect_timeout, attach, resume, inline_tensors, num_threads, max_message_bytes,
    arena_bytes, page_size, tls_*, auth_token, auth_token_file); durations in seconds.
    Raises Unavailable when the daemon cannot be reached within connect_timeout.
    """
    from ._kvarena import _connect
    return _connect(address, **options)


__all__ = [
    "Aborted", "AlreadyExists", "Cache", "Cancelled", "Client", "DataLoss", "DeadlineExceeded",
    "DecodeBatch", "Error", "FailedPrecondition", "Internal", "InvalidArgument", "NotFound",
    "OutOfRange", "PermissionDenied", "ResourceExhausted", "StatusCode", "Tensor",
    "Unauthenticated", "Unavailable", "Unimplemented", "Unknown", "connect",
    "flashinfer_page_table", "vllm_block_tables",
]
