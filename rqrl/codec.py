"""Numbers <-> bytes without pickle (safetensors), and the cloudpickle blobs a run stores once.

Trajectories and weights are safetensors buffers: a JSON header naming dtypes and shapes, then
raw little-endian data. Decoding them can never execute code. Only the env factory and the
policy architecture, which are code by nature, go through cloudpickle, signed with HMAC-SHA256
under the run's shared secret and verified before they are unpickled.

Records and weights are signed too (``sign(blob, key, RECORD_MAGIC)``), under keys derived from the
secret and the run id (``records_key``, ``weights_key``): a Redis writer without the secret can
neither forge a rollout nor publish weights, and a tag made for one run or purpose fits no other.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Mapping
from typing import Any

import cloudpickle
import numpy as np
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

from rqrl.errors import RecordError, SignatureError

_MAX_HEADER_BYTES = 1 << 24


def encode_arrays(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """Serialize named numpy arrays and string metadata into one safetensors buffer."""
    # ascontiguousarray turns 0-d arrays into shape (1,): reshape keeps scalars scalar
    contiguous = {name: np.ascontiguousarray(array).reshape(np.shape(array)) for name, array in arrays.items()}
    return safetensors.numpy.save(contiguous, metadata=dict(metadata))


def read_metadata(blob: bytes) -> dict[str, str]:
    """Return the string metadata of a safetensors buffer without decoding its arrays."""
    if len(blob) < 8:
        raise RecordError(f"expected a safetensors buffer, got {len(blob)} bytes")
    (header_size,) = struct.unpack("<Q", blob[:8])
    if header_size > min(_MAX_HEADER_BYTES, len(blob) - 8):
        raise RecordError(f"safetensors header of {header_size} bytes does not fit a {len(blob)}-byte buffer")
    try:
        header = json.loads(blob[8 : 8 + header_size])
    except ValueError as error:
        raise RecordError(f"safetensors header is not JSON: {error}") from error
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return dict(metadata) if isinstance(metadata, dict) else {}


def decode_arrays(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Inverse of encode_arrays; raises RecordError on anything malformed."""
    metadata = read_metadata(blob)
    try:
        arrays = safetensors.numpy.load(blob)
    except Exception as error:  # safetensors raises several types for bad input
        raise RecordError(f"cannot decode safetensors buffer: {error}") from error
    return arrays, metadata


def encode_state_dict(state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """Serialize a torch state dict (any dtype, any device) into a safetensors buffer."""
    tensors = {}
    for name, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(value).__name__}, expected a torch.Tensor")
        # clone so tied weights (shared storage) serialize as independent tensors
        tensors[name] = value.detach().to("cpu").contiguous().clone()
    return safetensors.torch.save(tensors, metadata=dict(metadata))


def decode_state_dict(blob: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Inverse of encode_state_dict; never calls a pickle-based loader."""
    metadata = read_metadata(blob)
    try:
        tensors = safetensors.torch.load(blob)
    except Exception as error:
        raise RecordError(f"cannot decode weights buffer: {error}") from error
    return tensors, metadata


_SIGNATURE_MAGIC = b"RQRLSIG1"  # signed pickles (env factory, policy), under the secret itself
RECORD_MAGIC = b"RQRLREC1"  # rollout records, under records_key(secret, run_id)
WEIGHTS_MAGIC = b"RQRLWTS1"  # weights blobs, under weights_key(secret, run_id)
_DIGEST_SIZE = hashlib.sha256().digest_size
TAG_SIZE = len(_SIGNATURE_MAGIC) + _DIGEST_SIZE
"""Bytes a signed blob adds in front of its payload: the magic, then the HMAC-SHA256 digest."""


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


def sign(payload: bytes, secret: str | bytes, magic: bytes = _SIGNATURE_MAGIC) -> bytes:
    """``magic + HMAC-SHA256(secret, payload) + payload``."""
    digest = hmac.new(secret_bytes(secret), payload, hashlib.sha256).digest()
    return magic + digest + payload


def verify(signed: bytes, secret: str | bytes, magic: bytes = _SIGNATURE_MAGIC) -> bytes:
    """The payload of a signed blob; SignatureError if it is unsigned, tampered or signed with another secret
    (or another run's key). Checks the digest before anything reads the payload."""
    if len(signed) < TAG_SIZE or not signed.startswith(magic):
        raise SignatureError(
            f"refusing an unsigned payload (it does not start with {magic.decode()}): only data signed with "
            f"RQRL_SECRET is trusted"
        )
    digest, payload = signed[len(magic) : TAG_SIZE], signed[TAG_SIZE:]
    expected = hmac.new(secret_bytes(secret), payload, hashlib.sha256).digest()
    if not hmac.compare_digest(digest, expected):
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
