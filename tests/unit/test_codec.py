"""State dicts and arrays <-> safetensors bytes, and refusing bytes that are not ours."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors.numpy
import torch

from rqrl.engine.codec import (
    RECORD_MAGIC,
    TAG_SIZE,
    WEIGHTS_MAGIC,
    decode_arrays,
    decode_state_dict,
    dumps_object,
    encode_arrays,
    encode_state_dict,
    loads_object,
    payload_tag,
    read_metadata,
    records_key,
    secret_from_environment,
    sign,
    verify,
    weights_key,
)
from rqrl.errors import ConfigError, RecordError, SignatureError
from tests import fixtures


def test_state_dict_round_trip_keeps_values_dtypes_shapes_and_metadata():
    policy = fixtures.mlp_policy(seed=3)
    state = policy.state_dict()
    blob = encode_state_dict(state, {"version": "4", "note": "hi"})
    decoded, metadata = decode_state_dict(blob)
    assert metadata == {"version": "4", "note": "hi"}
    assert set(decoded) == set(state)
    for name, tensor in state.items():
        assert decoded[name].dtype == tensor.dtype and decoded[name].shape == tensor.shape
        assert torch.equal(decoded[name], tensor)
    fresh = fixtures.mlp_policy(seed=99)
    fresh.load_state_dict(decoded)
    obs = torch.randn(5, 4)
    assert torch.equal(fresh(obs), policy(obs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int64, torch.bool,
                                   torch.int16, torch.int32, torch.uint8])
def test_state_dict_round_trip_of_each_dtype(dtype):
    values = (torch.arange(-6, 6).reshape(3, 4) * 1.25).to(dtype)
    decoded, _ = decode_state_dict(encode_state_dict({"x": values, "scalar": values.flatten()[1].clone()}, {}))
    assert decoded["x"].dtype == dtype
    assert torch.equal(decoded["x"], values)
    assert decoded["scalar"].shape == ()


def test_bfloat16_values_are_kept_bit_for_bit():
    values = torch.tensor([1.0, -3.140625, 1e-20, 3e38, float("inf")], dtype=torch.bfloat16)
    decoded, _ = decode_state_dict(encode_state_dict({"w": values}, {}))
    assert torch.equal(decoded["w"].view(torch.int16), values.view(torch.int16))


def test_tied_weights_round_trip_as_independent_equal_tensors():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(6, 4)
            self.head = torch.nn.Linear(4, 6, bias=False)
            self.head.weight = self.embed.weight

    module = Tied()
    state = module.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()
    decoded, _ = decode_state_dict(encode_state_dict(state, {}))
    assert torch.equal(decoded["embed.weight"], state["embed.weight"])
    assert torch.equal(decoded["head.weight"], state["head.weight"])
    fresh = Tied()
    fresh.load_state_dict(decoded)
    assert torch.equal(fresh.head.weight, module.head.weight)
    assert fresh.head.weight is fresh.embed.weight


def test_views_and_non_contiguous_tensors_round_trip():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "slice": base[1:3, ::2], "base": base}
    decoded, _ = decode_state_dict(encode_state_dict(state, {}))
    for name, tensor in state.items():
        assert torch.equal(decoded[name], tensor), name


def test_a_transposed_or_sliced_tensor_round_trips_as_its_values():
    """Views are written as their own values, in order, not as the storage under them."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"transposed": base.t(), "row": base[2], "column": base[:, 3], "offset": base.flatten()[5:9]}
    decoded, _ = decode_state_dict(encode_state_dict(state, {}))
    for name, tensor in state.items():
        assert torch.equal(decoded[name], tensor), name


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.float8_e4m3fn])
def test_encode_state_dict_refuses_a_dtype_safetensors_0_4_cannot_read(dtype):
    with pytest.raises(TypeError, match=rf"'phase' has dtype {dtype}, which safetensors cannot carry: cast it"):
        encode_state_dict({"phase": torch.zeros(2, dtype=dtype)}, {})


def test_a_negative_view_is_written_as_its_values():
    """``z.conj().imag`` is a view with torch's negative bit: its stored bytes are the values' opposites."""
    imag = torch.tensor([1 + 2j, 3 - 4j]).conj().imag
    decoded, _ = decode_state_dict(encode_state_dict({"imag": imag}, {}))
    assert torch.equal(decoded["imag"], torch.tensor([-2.0, 4.0]))


def test_encode_state_dict_refuses_non_tensors():
    with pytest.raises(TypeError, match="'step'.*int"):
        encode_state_dict({"w": torch.zeros(2), "step": 3}, {})


def test_encoded_state_dict_needs_no_pickle():
    blob = encode_state_dict({"w": torch.ones(2)}, {"version": "1"})
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_size])
    assert header["w"]["dtype"] == "F32" and header["__metadata__"] == {"version": "1"}


def test_arrays_round_trip():
    arrays = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.array([True, False]),
              "c": np.zeros((0, 4), np.float32), "d": np.arange(10.0)[::3]}
    decoded, metadata = decode_arrays(encode_arrays(arrays, {"k": "v"}))
    assert metadata == {"k": "v"}
    for name, array in arrays.items():
        assert decoded[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded[name], array)


def test_read_metadata_of_a_valid_buffer_without_decoding():
    blob = encode_arrays({"a": np.zeros(3)}, {"run_id": "r", "format": "f"})
    assert read_metadata(blob) == {"run_id": "r", "format": "f"}
    assert read_metadata(encode_arrays({"a": np.zeros(3)}, {})) == {}


@pytest.mark.parametrize("blob", [
    b"",
    b"1234567",
    struct.pack("<Q", 1 << 40) + b"{}",
    struct.pack("<Q", 10) + b"{}",
    struct.pack("<Q", 4) + b"nope",
    struct.pack("<Q", 2) + b"\xff\xfe",
    struct.pack("<Q", 0),
])
def test_read_metadata_refuses_garbage(blob):
    with pytest.raises(RecordError):
        read_metadata(blob)


def test_read_metadata_of_a_header_without_metadata_is_empty():
    assert read_metadata(struct.pack("<Q", 2) + b"[]") == {}
    assert read_metadata(struct.pack("<Q", 2) + b"{}") == {}
    assert read_metadata(struct.pack("<Q", 22) + b'{"__metadata__": "x"} ') == {}


SHORT_HEADER = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'


@pytest.mark.parametrize("blob", [
    b"garbage bytes here",
    struct.pack("<Q", 2) + b"{}" + b"\x00" * 5,  # data that no tensor claims
    struct.pack("<Q", len(SHORT_HEADER)) + SHORT_HEADER + b"\x00" * 4,  # 16 bytes promised, 4 given
])
def test_decoders_refuse_garbage_with_record_error(blob):
    with pytest.raises(RecordError):
        decode_state_dict(blob)
    with pytest.raises(RecordError):
        decode_arrays(blob)


def test_truncated_weights_are_refused():
    blob = encode_state_dict({"w": torch.ones(100)}, {"version": "1"})
    with pytest.raises(RecordError):
        decode_state_dict(blob[:-4])


def test_objects_round_trip_through_cloudpickle():
    factory = loads_object(dumps_object(fixtures.make_counting_env, "s3cret"), "s3cret")
    env = factory()
    assert isinstance(env, fixtures.CountingEnv) and env.length == 50
    double = loads_object(dumps_object(lambda x: 2 * x, b"s3cret"), "s3cret")
    assert double(21) == 42


def test_unsigned_pickles_are_refused_before_unpickling(tmp_path):
    import pickle

    marker = tmp_path / "ran"
    hostile = pickle.dumps(_Boom(str(marker)))
    with pytest.raises(SignatureError, match="unsigned"):
        loads_object(hostile, "s3cret")
    assert not marker.exists()


def test_tampered_or_foreign_signatures_are_refused():
    signed = dumps_object({"a": 1}, "s3cret")
    tampered = signed[:-1] + bytes([signed[-1] ^ 1])
    with pytest.raises(SignatureError, match="tampered"):
        loads_object(tampered, "s3cret")
    with pytest.raises(SignatureError, match="different RQRL_SECRET"):
        loads_object(signed, "another secret")
    assert verify(sign(b"payload", "k"), "k") == b"payload"


def test_derived_keys_differ_by_purpose_run_and_secret():
    keys = {records_key("s", "run-a"), records_key("s", "run-b"), records_key("t", "run-a"), weights_key("s", "run-a"),
            weights_key("s", "run-b"), b"s"}
    assert len(keys) == 6
    assert records_key("s", "run-a") == records_key(b"s", "run-a"), "str and bytes secrets are the same secret"
    assert len(records_key("s", "run-a")) == 32


def test_a_tag_under_one_key_or_magic_verifies_under_no_other():
    payload = encode_arrays({"rewards": np.ones(4, np.float32)}, {"run_id": "run-a"})
    key = records_key("s", "run-a")
    tagged = sign(payload, key, RECORD_MAGIC)
    assert len(tagged) == TAG_SIZE + len(payload) and tagged.startswith(RECORD_MAGIC)
    assert verify(tagged, key, RECORD_MAGIC) == payload
    for other_key in (records_key("s", "run-b"), weights_key("s", "run-a"), records_key("guess", "run-a"), b"s"):
        with pytest.raises(SignatureError, match="tampered"):
            verify(tagged, other_key, RECORD_MAGIC)
    with pytest.raises(SignatureError, match="unsigned"):
        verify(tagged, key, WEIGHTS_MAGIC)  # a record is never taken for weights, nor a pickle for either
    with pytest.raises(SignatureError, match="unsigned"):
        verify(payload, key, RECORD_MAGIC)


def test_the_tag_is_keyed_blake3_under_a_key_derived_from_the_secret():
    import blake3

    key = blake3.blake3(b"s3cret", derive_key_context="rqrl 2026-11-27 payload tag key").digest()
    assert sign(b"payload", "s3cret", RECORD_MAGIC) == RECORD_MAGIC + blake3.blake3(b"payload", key=key).digest() + (
        b"payload")
    assert payload_tag(memoryview(b"xpayload")[1:], b"s3cret") == payload_tag(b"payload", "s3cret")


def test_a_blob_of_another_rqrl_version_is_refused_with_what_to_do():
    import hashlib
    import hmac

    key = records_key("s", "run-a")
    payload = encode_arrays({"rewards": np.ones(4, np.float32)}, {"run_id": "run-a"})
    older = b"RQRLREC1" + hmac.new(key, payload, hashlib.sha256).digest() + payload  # HMAC-SHA256, before BLAKE3
    with pytest.raises(SignatureError, match=r"another rqrl version \(RQRLREC1; this one reads RQRLREC2\): run the "
                                             r"same rqrl version on the learner and on every worker"):
        verify(older, key, RECORD_MAGIC)


@pytest.mark.parametrize("position", [0, 7, 8, 39, 40, 41, -1])
def test_any_flipped_bit_of_a_tagged_blob_is_refused(position):
    key = weights_key("s", "run-a")
    tagged = bytearray(sign(encode_state_dict({"w": torch.ones(3)}, {"version": "1"}), key, WEIGHTS_MAGIC))
    tagged[position] ^= 0x10
    with pytest.raises(SignatureError):
        verify(bytes(tagged), key, WEIGHTS_MAGIC)


class _Boom:
    """Unpickling this would create a file: proof that a refused payload never ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


INTEROP_ARRAYS = {
    "int16": np.arange(6, dtype=np.int16).reshape(2, 3), "bool": np.array([True, False]),
    "empty": np.zeros((0, 4), np.float32), "strided": np.arange(10.0)[::3], "scalar": np.array(3.5, np.float32),
    "uint8": np.array(7, np.uint8), "big_endian": np.arange(3, dtype=">i4"), "zero_width": np.zeros((2, 0)),
}


def test_encoded_arrays_are_safetensors_that_the_safetensors_library_reads():
    loaded = safetensors.numpy.load(encode_arrays(INTEROP_ARRAYS, {"k": "v"}))
    for name, array in INTEROP_ARRAYS.items():
        assert loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name], array)


def test_buffers_the_safetensors_library_writes_decode():
    native = {name: np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")).reshape(array.shape)
              for name, array in INTEROP_ARRAYS.items()}
    decoded, metadata = decode_arrays(safetensors.numpy.save(native, metadata={"k": "v"}))
    assert metadata == {"k": "v"}
    for name, array in native.items():
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape, name
        np.testing.assert_array_equal(decoded[name], array)


def test_decoded_arrays_are_read_only_views_of_the_buffer():
    blob = encode_arrays({"a": np.arange(1000.0)}, {})
    decoded, _ = decode_arrays(blob)
    assert not decoded["a"].flags.writeable and not decoded["a"].flags.owndata


def _buffer(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("header, data", [
    ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)),  # a dtype records never carry
    ({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, bytes(4)),  # a float size
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4)),  # shape and offsets disagree
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
      "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, bytes(3)),  # overlapping
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
      "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}}, bytes(5)),  # a gap
    ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, bytes(3)),  # a byte left over
    ({"a": {"dtype": "U8", "shape": [2]}}, bytes(2)),  # no offsets
    ({"a": "U8"}, bytes(0)),
    ([1, 2], bytes(0)),
])
def test_decode_arrays_refuses_malformed_buffers(header, data):
    with pytest.raises(RecordError):
        decode_arrays(_buffer(header, data))


def test_an_empty_state_dict_round_trips_with_its_metadata():
    """A policy without parameters publishes an empty state dict (safetensors 0.4.0 wrote that as invalid JSON)."""
    tensors, metadata = decode_state_dict(encode_state_dict({}, {"version": "3"}))
    assert tensors == {} and metadata == {"version": "3"}


def test_the_secret_comes_from_rqrl_secret_or_else_the_file_rqrl_secret_file_names(monkeypatch, tmp_path):
    monkeypatch.delenv("RQRL_SECRET", raising=False)
    monkeypatch.delenv("RQRL_SECRET_FILE", raising=False)
    assert secret_from_environment() is None
    secret_file = tmp_path / "rqrl_secret"
    secret_file.write_text("from-the-file\n")  # `openssl rand -hex 32 > FILE` ends it with a newline
    monkeypatch.setenv("RQRL_SECRET_FILE", str(secret_file))
    assert secret_from_environment() == "from-the-file"
    monkeypatch.setenv("RQRL_SECRET", "from-the-variable")
    assert secret_from_environment() == "from-the-variable", "the variable wins over the file"


@pytest.mark.parametrize("content", [None, "\n"])
def test_a_missing_or_empty_secret_file_is_an_error_that_names_it(monkeypatch, tmp_path, content):
    monkeypatch.delenv("RQRL_SECRET", raising=False)
    secret_file = tmp_path / "rqrl_secret"
    if content is not None:
        secret_file.write_text(content)
    monkeypatch.setenv("RQRL_SECRET_FILE", str(secret_file))
    with pytest.raises(ConfigError, match="RQRL_SECRET_FILE=.*rqrl_secret"):
        secret_from_environment()
