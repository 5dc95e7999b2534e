"""Wrong arguments raise a typed error — a kvarena.Error, TypeError or ValueError as Python
convention has it — never a bare RuntimeError; and a returned kvarena.Tensor reads as a
numpy array through np.asarray, without a copy."""

import numpy as np
import pytest
import torch

import kvarena


@pytest.fixture
def cache(client):
    c = client.allocate(1, 2, 8, "float32", page_size=4)
    yield c
    if c.is_valid:
        c.release()


@pytest.mark.parametrize("ids,error,what", [
    ("abc", TypeError, "not str"),
    (b"abc", TypeError, "not bytes"),
    (5, TypeError, "not int"),
    ([1, 2.5], TypeError, "element 1 is a float"),
    ([[1, 2]], TypeError, "element 0 is a list"),
    ([1, None], TypeError, "element 1 is a NoneType"),
    (torch.ones(3), kvarena.InvalidArgument, "torch.float32"),
    (np.ones(3), kvarena.InvalidArgument, "float64"),
    ([1, 1 << 40], kvarena.InvalidArgument, "out of int32 range"),
])
def test_bad_token_ids(client, cache, ids, error, what):
    with pytest.raises(error, match=what):
        cache.set_tokens(0, ids)
    with pytest.raises(error, match=what):
        client.allocate(1, 2, 8, "float32", prompt_tokens=ids)
    cache.set_tokens(0, torch.arange(3))  # an integer tensor is fine
    cache.set_tokens(0, np.arange(3, dtype=np.int32))


@pytest.mark.parametrize("options,error,what", [
    ({"max_message_bytes": -1}, kvarena.InvalidArgument, "max_message_bytes=-1"),
    ({"max_message_bytes": 1 << 70}, kvarena.InvalidArgument, "max_message_bytes="),
    ({"max_message_bytes": 1 << 40}, kvarena.InvalidArgument, "max_message_bytes="),
    ({"max_message_bytes": "64Mi"}, TypeError, "max_message_bytes takes an int, not str"),
    ({"arena_bytes": -5}, kvarena.InvalidArgument, "arena_bytes=-5"),
    ({"num_threads": -2}, kvarena.InvalidArgument, "num_threads=-2"),
    ({"page_size": 1.5}, TypeError, "page_size takes an int, not float"),
    ({"attach": "yes"}, TypeError, "attach takes a bool, not str"),
    ({"inline_tensors": 1}, TypeError, "inline_tensors takes a bool, not int"),
    ({"call_timeout": "5"}, TypeError, "call_timeout takes a number of seconds"),
    ({"call_timeout": -1}, kvarena.InvalidArgument, "call_timeout=-1"),
    ({"client_name": 7}, TypeError, "client_name takes a str, not int"),
    ({"tls_ca_file": 7}, TypeError, "tls_ca_file takes a str or os.PathLike"),
    ({"no_such_option": 1}, TypeError, "unknown option"),
])
def test_bad_connect_options(options, error, what):
    with pytest.raises(error, match=what):
        kvarena.connect("inproc:", **options)


def test_pybind11_conversion_errors_are_type_errors(client, cache):
    with pytest.raises(TypeError):
        cache.append("layer", torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    with pytest.raises(TypeError):
        client.reserve([(cache, "one")])
    with pytest.raises(TypeError):
        client.decode_batch([cache, "not a cache"])


def test_returned_tensor_reads_through_np_asarray(address):
    client = kvarena.connect(address)
    cache = client.allocate(1, 2, 8, "float32", page_size=4)
    k = torch.arange(2 * 3 * 8, dtype=torch.float32).reshape(1, 2, 3, 8)
    cache.append(0, k, k + 1)
    got_k, got_v = cache.get_kv(0)
    a = np.asarray(got_k)
    assert a.dtype == np.float32 and a.shape == (1, 2, 3, 8)
    assert a.ctypes.data == got_k.data_ptr  # no copy
    np.testing.assert_array_equal(a, k.numpy())
    np.testing.assert_array_equal(np.array(got_v), k.numpy() + 1)
    assert np.asarray(got_k, dtype=np.float64).dtype == np.float64
    t = kvarena.vllm_block_tables([(cache, 0)], 0)
    assert np.asarray(t.block_tables).dtype == np.int32
    assert np.asarray(t.first_pos).dtype == np.int64


def test_bfloat16_tensor_names_torch_for_numpy(client):
    cache = client.allocate(1, 2, 8, "bfloat16", page_size=4)
    k = torch.ones(1, 2, 1, 8, dtype=torch.bfloat16)
    cache.append(0, k, k)
    got_k, _ = cache.get_kv(0)
    with pytest.raises(TypeError, match="torch.from_dlpack"):
        np.asarray(got_k)
    assert torch.from_dlpack(got_k).dtype == torch.bfloat16
