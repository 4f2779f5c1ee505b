"""Numbers <-> bytes without pickle (safetensors), and the cloudpickle blobs a run stores once.

Trajectories and weights are safetensors buffers: a JSON header naming dtypes and shapes, then
raw little-endian data. Decoding them can never execute code. Only the env factory and the
policy architecture, which are code by nature, go through cloudpickle, signed (keyed BLAKE3) under the
run's shared secret and verified before they are unpickled.

Records and weights are signed too (``sign(blob, key, RECORD_MAGIC)``), under keys derived from the
secret and the run id (``records_key``, ``weights_key``): a Redis writer without the secret can
neither forge a rollout nor publish weights, and a tag made for one run or purpose fits no other.
The tag is keyed BLAKE3: a MAC like HMAC-SHA256, measured 2-4x faster on rollout-sized buffers, which
matters when every env step's frame is tagged on the worker and checked on the learner.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import blake3
import cloudpickle
import numpy as np

from rqrl.errors import ConfigError, RecordError, SignatureError

if TYPE_CHECKING:
    import torch

MAX_ID = 2**62
"""Rollout ids and policy versions stay below this: they become int64 tensors, and no run gets near it."""
_MAX_HEADER_BYTES = 1 << 24


# safetensors dtype names <-> numpy dtypes (little-endian), for the arrays records carry
_NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"), "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
}
_SAFETENSORS_NAMES: dict[np.dtype, str] = {dtype: name for name, dtype in _NUMPY_DTYPES.items()}


@dataclass(frozen=True)
class ArrayParts:
    """An array given as the parts that, back to back, make it: ``shape`` overall, every part of one dtype.
    Lets a writer lay out rows that live in separate arrays (one per actor) without stacking them first."""

    shape: tuple[int, ...]
    parts: Sequence[np.ndarray]


def encode_arrays(arrays: Mapping[str, np.ndarray | ArrayParts], metadata: Mapping[str, str]) -> bytes:
    """Serialize named numpy arrays (or ArrayParts) and string metadata into one safetensors buffer.

    Written here rather than by ``safetensors.numpy.save``, which copies every array twice on the way
    (to bytes, then into the buffer): a record's arrays are small and many, so the per-array overhead is
    the cost. The layout is safetensors' own (8-byte header size, JSON header padded to 8 bytes, then the
    arrays' little-endian bytes back to back), so any safetensors reader reads it."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks: list[bytes | memoryview] = []
    offset = 0
    for name, value in arrays.items():
        shape, parts = (value.shape, value.parts) if isinstance(value, ArrayParts) else (None, (value,))
        dtype_name, size = None, 0
        for part in parts:
            array = np.asarray(part)
            little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
            part_dtype = _SAFETENSORS_NAMES.get(little)
            if part_dtype is None or dtype_name not in (None, part_dtype):
                raise TypeError(f"array {name!r} has dtype {array.dtype}, which safetensors cannot carry "
                                f"(or its parts differ in dtype)")
            dtype_name = part_dtype
            if little is not array.dtype or not array.flags.c_contiguous:
                array = np.ascontiguousarray(array, dtype=little)
            chunks.append(array.reshape(-1).view(np.uint8).data)  # a view of the array's bytes, copied once by join
            size += array.nbytes
            shape = array.shape if shape is None else shape
        if dtype_name is None or shape is None or math.prod(shape) * _NUMPY_DTYPES[dtype_name].itemsize != size:
            raise ValueError(f"array {name!r}: its parts hold {size} bytes, not shape {list(shape or ())}")
        header[name] = {"dtype": dtype_name, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return _join(header, chunks)


def _join(header: Mapping[str, Any], chunks: Sequence[bytes | memoryview]) -> bytes:
    """A safetensors buffer of ``header`` and the arrays' bytes ``chunks``, back to back: one copy of each."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *chunks])


def _header(blob: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors buffer and where its data starts; RecordError if malformed."""
    if len(blob) < 8:
        raise RecordError(f"expected a safetensors buffer, got {len(blob)} bytes")
    (header_size,) = struct.unpack_from("<Q", blob)
    if header_size > min(_MAX_HEADER_BYTES, len(blob) - 8):
        raise RecordError(f"safetensors header of {header_size} bytes does not fit a {len(blob)}-byte buffer")
    try:
        header = json.loads(bytes(blob[8 : 8 + header_size]))
    except ValueError as error:
        raise RecordError(f"safetensors header is not JSON: {error}") from error
    return header, 8 + header_size


def read_metadata(blob: bytes | memoryview) -> dict[str, str]:
    """Return the string metadata of a safetensors buffer without decoding its arrays."""
    header, _ = _header(blob)
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(metadata) if isinstance(metadata, dict) else {}


def _whole(value: object) -> int:
    """A JSON integer >= 0 (not a bool, float or string); ValueError otherwise."""
    if type(value) is not int or value < 0:
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def decode_arrays(blob: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Inverse of encode_arrays: read-only arrays that view ``blob`` (no copy); RecordError on anything
    malformed. Checks what safetensors' own reader checks: known dtypes, sizes that match the shapes,
    and data offsets that tile the data section exactly, with no gap, overlap or byte left over."""
    header, start = _header(blob)
    if not isinstance(header, dict):
        raise RecordError("safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    entries = []
    for name, entry in header.items():
        try:
            dtype = _NUMPY_DTYPES[entry["dtype"]]
            shape = tuple(_whole(size) for size in entry["shape"])
            begin, end = (_whole(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise RecordError(f"safetensors entry {name!r} is malformed: {entry!r}") from error
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize:
            raise RecordError(f"safetensors entry {name!r}: shape {list(shape)} of {entry['dtype']} does not fit "
                              f"offsets [{begin}, {end})")
        entries.append((begin, end, name, dtype, shape, count))
    entries.sort(key=lambda item: (item[0], item[1]))
    position = 0
    for begin, end, name, *_ in entries:
        if begin != position:
            raise RecordError(f"safetensors entry {name!r} starts at {begin}, expected {position}")
        position = end
    if start + position != len(blob):
        raise RecordError(f"safetensors data is {len(blob) - start} bytes, its entries cover {position}")
    arrays = {name: np.frombuffer(blob, dtype, count, start + begin).reshape(shape)
              for begin, _, name, dtype, shape, count in entries}
    return arrays, dict(metadata) if isinstance(metadata, dict) else {}


def encode_state_dict(state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """Serialize a torch state dict (any dtype, any device) into a safetensors buffer.

    Written here rather than by ``safetensors.torch.save``, which took 8 ms to lay out a Nature CNN's 6.7 MB (and
    needed a clone of each tensor first, for tied weights): each tensor's bytes are copied once, by the join, on
    the learner's path after every update. Tied weights come out as independent equal tensors."""
    import torch  # here, not at the top: what reads records or run state needs no torch

    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks: list[memoryview] = []
    offset = 0
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(value).__name__}, expected a torch.Tensor")
        dtype = _torch_dtype_names().get(value.dtype)
        if dtype is None:
            raise TypeError(f"state dict entry {name!r} has dtype {value.dtype}, which safetensors cannot carry: "
                            f"cast it to a float or integer dtype")
        tensor = value.detach().to("cpu").resolve_neg().contiguous()  # a negative view's bytes are its values
        data = tensor.reshape(-1).view(torch.uint8).numpy()  # its bytes (torch is little-endian where it runs)
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
        chunks.append(data.data)
    return _join(header, chunks)


@functools.cache
def _torch_dtype_names() -> dict[torch.dtype, str]:
    """torch dtypes -> safetensors dtype names: those every safetensors rqrl takes (0.4.0 on) reads back (torch
    imported on first use)."""
    import torch

    return {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
            torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
            torch.float64: "F64"}


def decode_state_dict(blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Inverse of encode_state_dict; never calls a pickle-based loader."""
    import safetensors.torch

    metadata = read_metadata(blob)
    try:
        tensors = safetensors.torch.load(blob)
    except Exception as error:
        raise RecordError(f"cannot decode weights buffer: {error}") from error
    return tensors, metadata


_SIGNATURE_MAGIC = b"RQRLSIG2"  # signed pickles (env factory, policy), under the secret itself
RECORD_MAGIC = b"RQRLREC2"  # rollout records, under records_key(secret, run_id)
WEIGHTS_MAGIC = b"RQRLWTS2"  # weights blobs, under weights_key(secret, run_id)
_DIGEST_SIZE = 32
TAG_SIZE = len(_SIGNATURE_MAGIC) + _DIGEST_SIZE
"""Bytes a signed blob adds in front of its payload: the magic, then the keyed BLAKE3 tag."""
_TAG_KEY_CONTEXT = "rqrl 2026-11-27 payload tag key"
"""BLAKE3's key derivation context: turns a secret of any length into the 32-byte key a keyed hash takes."""


SECRET_VARIABLE = "RQRL_SECRET"
"""The environment variable that holds the shared secret (never a flag: flags show in `ps`)."""
SECRET_FILE_VARIABLE = "RQRL_SECRET_FILE"
"""The environment variable that names a file holding the shared secret (compose's and Kubernetes' secret files,
e.g. /run/secrets/rqrl_secret: the secret stays out of the environment and `docker inspect`)."""


def secret_from_environment() -> str | None:
    """The shared secret RQRL_SECRET holds, else the contents of the file RQRL_SECRET_FILE names (without its
    trailing newline); None if neither is set. ConfigError if that file cannot be read or is empty."""
    if secret := os.environ.get(SECRET_VARIABLE):
        return secret
    path = os.environ.get(SECRET_FILE_VARIABLE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            secret = file.read().rstrip("\r\n")
    except OSError as error:
        raise ConfigError(f"{SECRET_FILE_VARIABLE}={path}: cannot read the secret file ({error.strerror}); "
                          f"create it (e.g. openssl rand -hex 32 > FILE) and make it readable by this user") from error
    if not secret:
        raise ConfigError(f"{SECRET_FILE_VARIABLE}={path}: the secret file is empty; put a long random string in it")
    return secret


def secret_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def derive_key(secret: str | bytes, purpose: str, run_id: str) -> bytes:
    """``HMAC-SHA256(secret, b"rqrl-{purpose}:" + run_id)``: one key per use and run, so a tag made for one
    (a record, a weights blob, a run) never verifies as another."""
    return hmac.new(secret_bytes(secret), f"rqrl-{purpose}:{run_id}".encode(), hashlib.sha256).digest()


def records_key(secret: str | bytes, run_id: str) -> bytes:
    """The key workers tag their rollout records with and the learner checks them against."""
    return derive_key(secret, "records", run_id)


def weights_key(secret: str | bytes, run_id: str) -> bytes:
    """The key the learner tags the weights it publishes with and workers check them against."""
    return derive_key(secret, "weights", run_id)


@functools.lru_cache(maxsize=64)
def _tag_key(secret: bytes) -> bytes:
    return blake3.blake3(secret, derive_key_context=_TAG_KEY_CONTEXT).digest()


def payload_tag(payload: bytes | memoryview, secret: str | bytes) -> bytes:
    """The 32-byte keyed BLAKE3 tag of ``payload`` under ``secret``."""
    return blake3.blake3(payload, key=_tag_key(secret_bytes(secret))).digest()


def sign(payload: bytes, secret: str | bytes, magic: bytes = _SIGNATURE_MAGIC) -> bytes:
    """``magic + tag(secret, payload) + payload``."""
    return b"".join((magic, payload_tag(payload, secret), payload))


def verify(signed: bytes, secret: str | bytes, magic: bytes = _SIGNATURE_MAGIC) -> bytes:
    """The payload of a signed blob; SignatureError if it is unsigned, tampered or signed with another secret
    (or another run's key). Checks the digest before anything reads the payload."""
    return bytes(verified_view(signed, secret, magic))


def verified_view(signed: bytes, secret: str | bytes, magic: bytes = _SIGNATURE_MAGIC) -> memoryview:
    """verify without copying the payload: a view into ``signed`` (records are decoded straight from it)."""
    if len(signed) < TAG_SIZE or not signed.startswith(magic):
        if signed[: len(magic) - 1] == magic[:-1]:  # the same kind of blob, another format version
            found = bytes(signed[: len(magic)]).decode(errors="replace")
            raise SignatureError(
                f"refusing a payload signed by another rqrl version ({found}; this one reads {magic.decode()}): "
                f"run the same rqrl version on the learner and on every worker")
        raise SignatureError(
            f"refusing an unsigned payload (it does not start with {magic.decode()}): only data signed with "
            f"RQRL_SECRET is trusted"
        )
    view = memoryview(signed)
    digest, payload = signed[len(magic) : TAG_SIZE], view[TAG_SIZE:]
    if not hmac.compare_digest(digest, payload_tag(payload, secret)):
        raise SignatureError(
            "refusing a payload whose signature does not match: it was tampered with, forged, or the learner and "
            "this worker use different RQRL_SECRET values"
        )
    return payload


def dumps_object(obj: Any, secret: str | bytes) -> bytes:
    """Cloudpickle a code-bearing object (env factory, policy architecture) and sign it."""
    return sign(cloudpickle.dumps(obj), secret)


def loads_object(blob: bytes, secret: str | bytes) -> Any:
    """Unpickle what dumps_object wrote, after checking its signature (never before)."""
    return cloudpickle.loads(verify(blob, secret))
