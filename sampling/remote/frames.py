"""Messages between trainers and sampler servers: a JSON header and raw tensor bytes, never a pickle.

A frame is ``MAGIC``, the header's length and the payload's length (network order), the header (JSON:
the message's kind, its fields, and each tensor's dtype and shape), then the tensors' bytes, each
starting on an 8-byte boundary. The receiver reads the payload into one buffer and views each tensor in
it, so a batch's feature rows are copied once, by the socket. Nothing a peer sends is unpickled: a
header names only dtypes from :data:`DTYPES`, and frames larger than the limits are refused before any
allocation. A batch (PyG ``Data`` or ``HeteroData``) travels as its stores' attributes
(:func:`encode_batch`): tensors by reference into the payload, other values as JSON.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import torch

from graphstore.errors import GraphstoreError

MAGIC = b"GSB1"
_HEAD = struct.Struct("!4sIQ")
_ALIGN = 8
MAX_HEADER = 64 << 20  # bytes of JSON a frame may carry
MAX_PAYLOAD = 1 << 40  # bytes of tensors (a batch of 1,024 seeds at 15,10,5 over 1,000 features: ~0.6 GB)
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class FrameError(GraphstoreError, ConnectionError):
    """The peer closed the connection, or sent something that is not a frame of this protocol."""


def send(sock: socket.socket, kind: str, fields: dict[str, Any] | None = None,
         tensors: list[torch.Tensor] | tuple[torch.Tensor, ...] = ()) -> int:
    """Write one message; returns the bytes sent."""
    tensors = [_contiguous_cpu(t) for t in tensors]
    specs = [[_NAMES[t.dtype], list(t.shape)] for t in tensors]
    header = json.dumps({"kind": kind, "fields": fields or {}, "tensors": specs}).encode()
    sizes = [t.numel() * t.element_size() for t in tensors]
    payload = sum(_padded(n) for n in sizes)
    sock.sendall(_HEAD.pack(MAGIC, len(header), payload) + header)
    for tensor, size in zip(tensors, sizes):
        if size:
            sock.sendall(memoryview(tensor.view(torch.uint8).numpy()))
        if _padded(size) > size:
            sock.sendall(bytes(_padded(size) - size))
    return _HEAD.size + len(header) + payload


def receive(sock: socket.socket) -> tuple[str, dict[str, Any], list[torch.Tensor], int]:
    """Read one message: its kind, fields, tensors (views into one buffer) and size in bytes."""
    magic, header_len, payload_len = _HEAD.unpack(_exactly(sock, _HEAD.size))
    if magic != MAGIC or header_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
        raise FrameError(f"the peer sent something that is not a graphstore sampler frame (magic {magic!r}, header "
                         f"{header_len} bytes, payload {payload_len} bytes): is that address a sampler server?")
    try:
        header = json.loads(_exactly(sock, header_len))
        kind, fields, specs = header["kind"], header["fields"], header["tensors"]
        shapes = [(DTYPES[name], tuple(int(d) for d in shape)) for name, shape in specs]
    except (ValueError, KeyError, TypeError) as exc:
        raise FrameError(f"the peer sent a damaged frame header ({type(exc).__name__}: {exc})") from None
    sizes = [_numel(shape) * dtype.itemsize for dtype, shape in shapes]
    if sum(_padded(n) for n in sizes) != payload_len:
        raise FrameError(f"the peer's frame says {payload_len} payload bytes, its tensors {sum(sizes)}")
    buffer = bytearray(payload_len)
    view = memoryview(buffer)
    got = 0
    while got < payload_len:
        n = sock.recv_into(view[got:], payload_len - got)
        if n == 0:
            raise FrameError("the peer closed the connection in the middle of a message")
        got += n
    tensors, offset = [], 0
    for (dtype, shape), size in zip(shapes, sizes):
        if size:
            flat = torch.frombuffer(buffer, dtype=dtype, count=size // dtype.itemsize, offset=offset)
        else:
            flat = torch.empty(0, dtype=dtype)
        tensors.append(flat.view(shape))
        offset += _padded(size)
    return kind, fields, tensors, _HEAD.size + header_len + payload_len


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise FrameError("the peer closed the connection" if not got and not chunks else
                             "the peer closed the connection in the middle of a message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _padded(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        if d < 0:
            raise FrameError(f"the peer sent a tensor of negative shape {shape}")
        count *= d
    return count


def _contiguous_cpu(tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        tensor = torch.as_tensor(tensor)
    if tensor.dtype not in _NAMES:
        raise GraphstoreError(f"a tensor of dtype {tensor.dtype} cannot travel to or from a sampler server; "
                              f"the dtypes that can: {sorted(DTYPES)}")
    return tensor.detach().cpu().contiguous()


# -- batches --

def encode_batch(batch: Any) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A PyG ``Data`` or ``HeteroData`` as header fields and tensors (:func:`decode_batch` rebuilds it)."""
    from torch_geometric.data import HeteroData

    tensors: list[torch.Tensor] = []
    stores = []
    if isinstance(batch, HeteroData):
        groups = [("node", t, s) for t, s in batch.node_items()] + [("edge", list(t), s) for t, s in batch.edge_items()]
        groups.append(("global", None, batch._global_store))
    else:
        groups = [("global", None, batch._store)]
    for role, key, store in groups:
        attrs = {}
        for name, value in store.items():
            if isinstance(value, torch.Tensor):
                attrs[name] = {"t": len(tensors)}
                tensors.append(value)
            else:
                attrs[name] = {"v": _json_value(value, name)}
        stores.append({"role": role, "key": key, "attrs": attrs})
    return {"hetero": isinstance(batch, HeteroData), "stores": stores}, tensors


def decode_batch(fields: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    from torch_geometric.data import Data, HeteroData

    try:
        batch = HeteroData() if fields["hetero"] else Data()
        for store in fields["stores"]:
            role, key = store["role"], store["key"]
            target = (batch[tuple(key)] if role == "edge" else batch[key] if role == "node" else batch)
            for name, ref in store["attrs"].items():
                setattr(target, name, tensors[ref["t"]] if "t" in ref else ref["v"])
    except (KeyError, TypeError, IndexError) as exc:
        raise FrameError(f"a sampler server sent a batch this graphstore cannot read ({type(exc).__name__}: {exc}); "
                         "run the same graphstore version on servers and trainers") from None
    return batch


def _json_value(value: Any, name: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, name) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v, name) for k, v in value.items()}
    raise GraphstoreError(f"batch attribute {name!r} holds a {type(value).__name__}, which cannot travel from a sampler "
                          "server (tensors, numbers, strings and lists of them can); set it in a transform on the "
                          "trainer instead")
