"""What a rank answers for its partitions: one hop of sampling (the engine's kernel), node rows, edge attributes."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from graphstore.dataset.opened import Dataset
from graphstore.errors import InvalidInputError
from sampling.graph.kernel_args import BlockArgs, Variants
from sampling.kernels.rng import rng_state
from sampling.drivers.hop_driver import run_kernel
from sampling.kernels.picks import STRATEGY_LAST
from sampling.graph.topology import from_dataset, node_times
from sampling.distributed.transport import Transport
from sampling.distributed.wire import EDGE_IDS, POSITIONS, pack, pack_sample, span, unpack

SAMPLE, GATHER, EDGE_ATTR = "graphstore.sample", "graphstore.gather", "graphstore.edge_attr"


class SampleOptions(NamedTuple):
    """What the caller's sampler samples with, sent with each remote hop: the server builds (once per options,
    edge type and partition) the kernel arguments for them. ``message_edges``: the sampler's link-split mask
    (:class:`sampling.MessageEdges`; ``None``: every edge)."""

    weight_attr: str | None
    time_attr: str | None
    message_edges: Any


class PartitionServer:
    """What a rank answers for its partitions (one, or several when ranks are fewer than partitions):
    sampling, node rows (own and halo), edge attributes."""

    def __init__(self, dataset: Dataset, parts: int | Sequence[int]) -> None:
        self.dataset = dataset
        self.parts = (int(parts),) if isinstance(parts, (int, np.integer)) else tuple(int(p) for p in parts)
        self.stores = {p: dataset.partition(p) for p in self.parts}
        self._args: dict[tuple, BlockArgs] = {}  # (options, edge type, part) -> the kernel's arguments
        self._tops: dict[tuple, tuple[int, int, int]] = {}  # the same key -> what the answers' columns stay within
        self._lock = threading.Lock()
        self._local = threading.local()  # per serving thread: its generator

    def register(self, transport: Transport) -> None:
        transport.register(SAMPLE, self.sample)
        transport.register(GATHER, self.gather)
        transport.register(EDGE_ATTR, self.edge_attr)

    def _block_args(self, options: SampleOptions, edge_type: Any, part: int) -> BlockArgs:
        """The kernel's arguments for ``part``'s block of ``edge_type`` under a caller's options."""
        with self._lock:
            key = (options, edge_type, part)
            if key not in self._args:
                weight_attr, time_attr = options.weight_attr, options.time_attr
                topo = from_dataset(self.dataset, [part], weight_attr, time_attr, mask=options.message_edges)[edge_type]
                node_time = node_times(self.dataset, time_attr).get(topo.src_type) if time_attr else None
                # an edge type without the weight attribute samples uniformly (as in PyG)
                weighted = weight_attr is not None and topo.has_weight
                variants = Variants(weighted=weighted, temporal=time_attr is not None,
                                    node_time=node_time)
                self._args[key] = BlockArgs(topo.blocks, variants, node_time)
                self._tops[key] = (topo.num_src - 1, self.dataset.manifest.edge_type(edge_type).num_edges - 1,
                                   topo.blocks[0].num_edges - 1)
            return self._args[key]

    def _rng(self) -> np.ndarray:
        rng = getattr(self._local, "rng", None)
        if rng is None:  # each serving thread draws its own stream
            rng = self._local.rng = rng_state(int(np.random.SeedSequence().generate_state(1, np.uint64)[0]))
        return rng

    def sample(self, edge_type: Any, part: int, nodes: Any, fanout: int, replace: bool, seed_time: Any,
               strategy: int, options: SampleOptions, exclusion: tuple | None = None,
               returns: int = EDGE_IDS | POSITIONS,
               seed: int | None = None) -> tuple[Any, ...]:
        """One hop for ``nodes`` of this partition, by the caller's options, in the engine's kernel: its
        link split mask (``options.message_edges``) and the links of its batch to leave out (``exclusion``) are
        applied by the kernel, so the fanout counts admitted edges only; ``seed_time`` is each node's
        time limit; ``seed`` (the caller's draw) seeds this request's picks. Integers come and go packed
        (:func:`sampling.distributed.wire.pack`); edge IDs and positions only when ``returns`` asks for them."""
        nodes, seed_time = unpack(nodes), unpack(seed_time)
        if part not in self.parts:
            raise InvalidInputError(f"rank serving partition(s) {list(self.parts)} was asked to sample partition {part}")
        args = self._block_args(options, edge_type, part)
        block = args.blocks[0]
        nodes = np.asarray(nodes)
        _check_request(nodes, block.lo, block.hi, part, seed_time)
        limits = seed_time if seed_time is not None and len(seed_time) else None
        rng = rng_state(seed) if seed is not None else self._rng()
        row, col, eid, pos, _ = run_kernel(args, rng, nodes, fanout, replace, strategy == STRATEGY_LAST, limits,
                                           exclusion, in_order=True)
        if len(args.blocks) > 1 and len(col) > 1 and (col[1:] < col[:-1]).any():  # in request order (one block: it is)
            order = np.argsort(col, kind="stable")
            row, col, eid, pos = row[order], col[order], eid[order], pos[order]
        return pack_sample(col, len(nodes), (row, eid, pos), returns, self._tops[(options, edge_type, part)])

    def gather(self, node_type: Any, names: list[str], ids: Any, leave_out: tuple[str, Any] | None = None) -> list[Any]:
        """Rows of ``ids`` (packed or not; callers send one partition's IDs, its own or its halo's);
        integer attributes (labels, IDs, times) answer packed. ``leave_out = (name, positions)``: that
        attribute's rows at those positions are neither read nor sent (the caller's device cache has them)."""
        ids = unpack(ids)
        part = self.parts[0]
        if len(self.parts) > 1 and len(ids):  # the partition whose IDs these are
            owner = int(self.dataset.owner(np.asarray(ids[:1]), node_type)[0])
            part = owner if owner in self.parts else part
        store = self.stores[part][0]
        kept = ids
        if leave_out is not None:
            positions = np.asarray(unpack(leave_out[1]), dtype=np.int64)
            kept = torch.from_numpy(np.delete(np.asarray(ids, dtype=np.int64), positions))
        return [pack(store.get_tensor(node_type, name, kept if leave_out and name == leave_out[0] else ids))
                for name in names]

    def edge_attr(self, edge_type: Any, name: str, positions: Any, part: int | None = None) -> Any:
        """Edge attribute ``name`` at CSC ``positions`` of ``part`` (default: this rank's first partition;
        packed or not); integer values answer packed."""
        part = self.parts[0] if part is None else int(part)
        if part not in self.parts:
            raise InvalidInputError(f"rank serving partition(s) {list(self.parts)} was asked for edges of "
                                    f"partition {part}")
        return pack(self.stores[part][1].edge_attr(name, edge_type, unpack(positions)))


def _check_request(nodes: np.ndarray, lo: int, hi: int, part: int, seed_time: np.ndarray) -> None:
    """A peer's sampling request names only nodes this partition owns (the kernels do not bounds-check)."""
    if nodes.ndim != 1 or nodes.dtype.kind not in "iu":
        raise InvalidInputError(f"partition {part} was sent node IDs of dtype {nodes.dtype} and shape {nodes.shape}")
    if not len(nodes):
        low = high = lo
    elif nodes.dtype == np.int64 and nodes.flags.c_contiguous:  # one kernel pass
        low, high = span(nodes)
    else:
        low, high = nodes.min(), nodes.max()
    if int(low) < lo or int(high) >= hi:
        bad = nodes[(nodes < lo) | (nodes >= hi)]
        raise InvalidInputError(f"partition {part} was sent node ID {int(bad[0])} outside its range [{lo}, {hi}) "
                                f"({len(bad)} such IDs): the sender's data is damaged; run `graphstore verify`")
    if seed_time is not None and len(seed_time) and len(seed_time) != len(nodes):
        raise InvalidInputError(f"partition {part} was sent {len(seed_time)} seed times for {len(nodes)} nodes")
