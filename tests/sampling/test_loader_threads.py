"""Loader threads: batches in order, memory bounded, errors and shutdown; one seed gives the same batches
for every thread count (and worker count); the device feeder passes CPU batches through unchanged."""

from __future__ import annotations

import gc
import itertools
import random
import threading
import time

import numpy as np
import pytest
import torch
from torch_geometric.data import HeteroData

from graphstore.errors import InvalidInputError
from sampling import DeviceFeeder, LinkNeighborLoader, NeighborLoader
from sampling.loader.device_feed import is_pinned
from sampling.distributed.dist_loader import DistributedLinkNeighborLoader, DistributedNeighborLoader
from graphstore.dataset.rank_layout import RankLayout
from sampling.distributed.server import PartitionServer
from sampling.loader.loader_threads import LoaderThreads
from sampling.distributed.transport import LoopbackTransport

THREADS = (1, 2, 3)


def _view(batch) -> tuple:
    """Everything a batch holds (n_id, edge_index, x, y, labels, ...), comparable."""
    def plain(v):
        return v.tolist() if isinstance(v, torch.Tensor) else v

    if isinstance(batch, HeteroData):
        return tuple((str(s._key), tuple((k, plain(v)) for k, v in sorted(s.to_dict().items())))
                     for s in batch.stores)
    return tuple((k, plain(v)) for k, v in sorted(batch.to_dict().items()))


def _passes(make_loader, threads=THREADS, **kw) -> list[list[tuple]]:
    """One pass per thread count, each over a fresh loader with the same arguments."""
    return [[_view(b) for b in make_loader(loader_threads=n, **kw)] for n in threads]


# -- the pipeline itself --

def test_batches_come_in_order_and_in_flight_is_bounded():
    rng, taken, worst = random.Random(0), [0], [0]
    lock = threading.Lock()

    def make(i):
        with lock:
            worst[0] = max(worst[0], i - taken[0])  # drawn ahead of what the consumer has
            delay = rng.random() / 500
        time.sleep(delay)  # threads finish out of order
        return i * i

    source = iter(range(60))
    out = []
    for item in LoaderThreads(source.__next__, make, threads=3, depth=1):
        out.append(item)
        time.sleep(0.001)
        with lock:
            taken[0] += 1
    assert out == [i * i for i in range(60)]
    assert worst[0] <= 1 + 3  # depth + threads


def test_errors_arrive_at_their_batch_and_the_threads_stop():
    def make(i):
        if i == 5:
            raise ValueError("sampler broke at 5")
        return i

    it = LoaderThreads(iter(range(100)).__next__, make, threads=3, depth=2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="broke at 5"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)  # finished: stays finished
    assert it.alive() == 0

    def broken_index():
        raise KeyError("no more seeds")

    with pytest.raises(KeyError, match="no more seeds"):
        next(LoaderThreads(broken_index, None, threads=2))


def test_close_and_garbage_collection_stop_the_threads():
    it = LoaderThreads(itertools.count().__next__, lambda i: i, threads=3, depth=2)
    assert next(it) == 0
    it.close(timeout=5)
    assert it.alive() == 0
    with pytest.raises(StopIteration):
        next(it)
    it = LoaderThreads(itertools.count().__next__, lambda i: time.sleep(0.001) or i, threads=2)
    next(it)
    threads = list(it._threads)
    del it
    gc.collect()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads), "an iterator nobody holds keeps its threads running"


def test_loader_threads_run_torch_ops_alone_and_leave_the_consumers_count():
    before = torch.get_num_threads()
    seen = []
    it = LoaderThreads(iter(range(6)).__next__, lambda i: seen.append(torch.get_num_threads()) or i, threads=2)
    assert list(it) == list(range(6))
    assert set(seen) == {1}, "each loader thread runs torch's ops by itself"
    assert torch.get_num_threads() == before, "the consumer keeps its intra-op threads"


def test_bad_thread_counts_are_refused(graphs):
    data = graphs["data"].data
    with pytest.raises(InvalidInputError, match="loader_threads=0"):
        NeighborLoader(data, [2], batch_size=10, loader_threads=0)
    with pytest.raises(InvalidInputError, match="prefetch=-1"):
        NeighborLoader(data, [2], batch_size=10, prefetch=-1)
    with pytest.raises(InvalidInputError, match="give one of them"):
        NeighborLoader(data, [2], batch_size=10, loader_threads=2, num_workers=2)


# -- one seed, the same batches for every thread count --

@pytest.mark.parametrize("backend", ["data", "dataset3"])
def test_node_loader_gives_the_same_batches_for_every_thread_count(graphs, backend):
    g = graphs[backend]

    def loader(**kw):
        torch.manual_seed(3)  # the same shuffled order for every pass
        return NeighborLoader(g.data, [4, 3], input_nodes=torch.arange(150), batch_size=20, shuffle=True, seed=7,
                              **kw)

    passes = _passes(loader) + _passes(loader, threads=(2,), prefetch=3)
    assert len(passes[0]) == 8 and all(p == passes[0] for p in passes)
    batch = next(iter(loader(loader_threads=3)))
    assert np.allclose(batch.x.numpy(), g.x[batch.n_id.numpy()])


@pytest.mark.parametrize("backend", ["data", "dataset3"])
def test_link_loader_gives_the_same_batches_for_every_thread_count(graphs, backend):
    g = graphs[backend]
    links = torch.from_numpy(np.stack([g.src, g.dst]))[:, :240]

    def loader(**kw):
        torch.manual_seed(3)
        return LinkNeighborLoader(g.data, [3, 2], edge_label_index=links, batch_size=40, shuffle=True, seed=7,
                                  neg_sampling=dict(mode="binary", amount=1), **kw)

    passes = _passes(loader)
    assert len(passes[0]) == 6 and all(p == passes[0] for p in passes)


def test_hetero_loader_gives_the_same_batches_for_every_thread_count():
    rng = np.random.default_rng(0)
    data = HeteroData()
    data["a"].x, data["b"].x = torch.randn(50, 3), torch.randn(40, 2)
    data["a", "to", "b"].edge_index = torch.from_numpy(np.stack([rng.integers(0, 50, 300), rng.integers(0, 40, 300)]))
    data["b", "back", "a"].edge_index = data["a", "to", "b"].edge_index.flip(0)

    def loader(**kw):
        return NeighborLoader(data, [3, 2], input_nodes="a", batch_size=12, seed=5, **kw)

    passes = _passes(loader)
    assert len(passes[0]) == 5 and all(p == passes[0] for p in passes)


@pytest.mark.parametrize("kind", ["node", "link"])
def test_workers_give_the_batches_of_no_workers(graphs, kind):
    """Forked DataLoader workers (our kernels are serial numba: safe after fork) sample what the main
    process does, batch by batch, with the same seed (link negatives included)."""
    g = graphs["dataset3"]

    def loader(**kw):
        if kind == "node":
            made = NeighborLoader(g.data, [3, 3], input_nodes=torch.arange(120), batch_size=30, seed=2, **kw)
        else:
            links = torch.from_numpy(np.stack([g.src, g.dst]))[:, :120]
            made = LinkNeighborLoader(g.data, [3, 2], edge_label_index=links, batch_size=30, seed=2,
                                      neg_sampling=dict(mode="binary", amount=1), **kw)
        return [_view(b) for b in made]

    alone = loader()
    assert loader(num_workers=2, multiprocessing_context="fork") == alone
    assert loader(num_workers=2, multiprocessing_context="fork", prefetch=2) == alone


def test_a_pass_started_mid_way_samples_only_the_rest(graphs):
    g = graphs["dataset3"]
    loader = NeighborLoader(g.data, [3], input_nodes=torch.arange(200), batch_size=20, shuffle=True, seed=1,
                            loader_threads=3)
    sampled = []
    collate = loader.collate_fn
    loader.collate_fn = lambda index: sampled.append(1) or collate(index)

    def one_pass(skip=0):
        loader.node_sampler.set_epoch(4)
        loader.sampler.generator = torch.Generator().manual_seed(0)
        loader.skip_next = skip
        sampled.clear()
        return [_view(b) for b in loader]

    whole = one_pass()
    rest = one_pass(skip=6)
    assert len(whole) == 10 and rest == whole[6:]
    assert len(sampled) == 4, "skipped batches were sampled"


def test_steps_resumed_past_a_whole_pass_are_those_of_an_uninterrupted_run(graphs):
    """A rank with fewer batches than the agreed step count starts its seeds over within the epoch; a run
    resumed past that point draws the skipped pass's order and streams too (training.loop.batches.cycle)."""
    from training.loop.batches import cycle, restart_streams

    g = graphs["dataset3"]
    loader = NeighborLoader(g.data, [3], input_nodes=torch.arange(100), batch_size=20, shuffle=True, seed=1)

    def steps(start):
        restart_streams({"": loader}, epoch=2, seed=5)
        return [_view(b) for b in cycle(loader, 13, start)]

    whole = steps(0)
    assert len(whole) == 13 and steps(7) == whole[7:] and steps(11) == whole[11:]


def test_timers_add_up_over_the_loader_threads(graphs):
    from training.loop.batches import time_loader
    from training.report.timing import Timers

    g, timers = graphs["dataset3"], Timers()
    loader = NeighborLoader(g.data, [3, 3], input_nodes=torch.arange(200), batch_size=20, seed=0, loader_threads=3)
    time_loader(loader, timers)
    assert sum(1 for _ in loader) == 10
    seconds = timers.snapshot()
    assert seconds["sampling"] > 0 and seconds["feature_fetch"] > 0


# -- distributed, over the loopback transport --

def _group(ds):
    transports = LoopbackTransport.group(ds.num_parts)
    for rank, t in enumerate(transports):
        PartitionServer(ds, rank).register(t)
    return transports


@pytest.mark.parametrize("cache_rows", [0, 64])
def test_distributed_node_loader_gives_the_same_batches_for_every_thread_count(graphs, cache_rows):
    g = graphs["dataset3"]
    ds = g.data
    runs = []
    for n in THREADS:
        transport = _group(ds)[0]
        loader = DistributedNeighborLoader(ds, [4, 3], transport, torch.arange(0, 120), batch_size=15, seed=3,
                                           cache_rows=cache_rows, loader_threads=n)
        batches = list(loader)
        for b in batches:  # remote rows (through the cache, shared by the threads) are the right rows
            assert np.allclose(b.x.numpy(), g.x[b.n_id.numpy()])
        stats = loader.stats.snapshot()
        assert stats["requests"] == transport.calls > 0  # every call counted once, whatever the threads
        runs.append([_view(b) for b in batches])
    assert len(runs[0]) == 8 and all(r == runs[0] for r in runs)


def test_distributed_link_loader_gives_the_same_batches_for_every_thread_count(graphs):
    ds = graphs["dataset3"].data
    runs = []
    for n in THREADS:
        transport = _group(ds)[1]
        loader = DistributedLinkNeighborLoader(ds, [3, 2], transport, batch_size=50, seed=4, shuffle=True,
                                               neg_sampling=dict(mode="binary", amount=1), loader_threads=n)
        loader.sampler.generator = torch.Generator().manual_seed(0)
        runs.append([_view(b) for b in loader])
    assert len(runs[0]) > 3 and all(r == runs[0] for r in runs)


# -- rows gathered straight into pinned memory --

@pytest.fixture()
def allocations(monkeypatch):
    """Every allocation the feature stores make for gathered rows: (shape, pinned, the tensor). On the
    CPU the tensors are ordinary ones (torch has no pinned memory without an accelerator)."""
    from graphstore.dataset import rowmemory

    seen = []

    def allocate(shape, dtype, pin):
        t = torch.empty(shape, dtype=dtype, pin_memory=pin and torch.cuda.is_available())
        seen.append((tuple(shape), pin, t))
        return t

    monkeypatch.setattr(rowmemory, "_allocate", allocate)
    return seen


@pytest.mark.parametrize("store", ["pair", "dataset1", "dataset3", "distributed"])
def test_the_stores_gather_rows_into_pinned_memory_when_the_thread_asks(graphs, allocations, store):
    from graphstore.dataset import rowmemory
    from sampling.distributed.dist_features import DistributedFeatureStore

    g = graphs["dataset3" if store == "distributed" else store]
    if store == "distributed":  # rank 0 of 3: its own rows, the rest from the other partitions' servers
        ds = g.data
        features = DistributedFeatureStore(ds, _group(ds)[0], RankLayout(ds.num_parts, ds.num_parts))
    elif store == "pair":
        features = g.data[0]
    else:
        from graphstore.dataset.whole import DatasetFeatureStore

        features = DatasetFeatureStore(g.data)
    ids = torch.tensor([5, 0, 399, 17, 200, 5]) if store != "pair" else torch.tensor([5, 0, 399, 17])
    plain = features[None, "x", ids]
    assert not any(pin for _, pin, _ in allocations), "no pinned rows unless the thread asks"
    with rowmemory.pinned_rows():
        rows = features[None, "x", ids]
    pinned = [t for shape, pin, t in allocations if pin and shape == tuple(rows.shape)]
    assert pinned and rows.data_ptr() == pinned[-1].data_ptr(), "the rows are gathered into the pinned block"
    assert torch.equal(rows, plain) and np.allclose(rows.numpy(), g.x[ids.numpy()])
    allocations.clear()
    assert torch.equal(features[None, "x", ids], plain) and not any(pin for _, pin, _ in allocations), \
        "the request is the thread's, for the block it opens"


@pytest.mark.parametrize("direct", [True, False])  # DirectRows, and the page-cache DiskRows
def test_rows_a_disk_reader_serves_are_gathered_into_pinned_memory_and_a_sampler_process_block(graphs, allocations,
                                                                                               direct):
    """x read through the disk tier (a row reader, its hot rows in RAM): asked for pinned rows (a GPU's loader
    thread) the reader writes the rows into the pinned tensor, and in a sampler process into the block the batch
    is handed over in; no gather into a buffer of its own copied after."""
    import graphstore
    from graphstore.dataset import layout, rowmemory
    from graphstore.storage.directrows import direct_rows
    from graphstore.storage.diskrows import DiskRows
    from sampling.loader import handoff

    g = graphs["dataset1"]
    ds = graphstore.open_dataset(g.data.url)  # its own object: the reader is this test's
    path = layout.node_array(0, ds.manifest.node_types[0].key, "x")
    hot = np.array([0, 5, 17])
    reader = ds.read_through(path, lambda rows: (direct and direct_rows(ds.chunk_files(path), rows, hot, ring=0))
                             or DiskRows(rows, hot))
    store = ds.partition(0)[0]
    ids = torch.tensor([5, 0, 399, 17, 200, 5])
    plain = store[None, "x", ids]
    assert np.allclose(plain.numpy(), g.x[ids.numpy()]) and not allocations
    with rowmemory.pinned_rows():
        rows = store[None, "x", ids]
    assert len(allocations) == 1 and rows.data_ptr() == allocations[0][2].data_ptr() and allocations[0][1]
    slab = handoff.Slab(1 << 20)
    with rowmemory.rows_into(slab):
        inblock = store[None, "x", ids]
    start = slab.block.data_ptr()
    assert start <= inblock.data_ptr() < start + slab.capacity and len(allocations) == 1
    assert torch.equal(rows, plain) and torch.equal(inblock, plain)
    assert reader.snapshot()["hits"] == 3 * 4  # 5, 0, 17 and 5 again, in each of the three gathers


@pytest.mark.parametrize("store", ["pair", "dataset3", "distributed"])
def test_the_stores_check_a_batchs_attributes_without_comparing_its_index(graphs, monkeypatch, store):
    """PyG's ``TensorAttr.is_set`` compares the whole index tensor with a marker (tens of microseconds a
    call for a batch's 100k IDs, holding the GIL the loader threads share): the stores' attributes do not."""
    from torch_geometric.data import TensorAttr

    from graphstore.dataset.whole import DatasetFeatureStore
    from sampling.distributed.dist_features import DistributedFeatureStore

    ds = graphs["dataset3"].data
    features = {"pair": lambda: graphs["pair"].data[0], "dataset3": lambda: DatasetFeatureStore(ds),
                "distributed": lambda: DistributedFeatureStore(ds, _group(ds)[0],
                                                               RankLayout(ds.num_parts, ds.num_parts))}[store]()
    attrs = features.get_all_tensor_attrs()
    for attr in attrs:
        attr.index = torch.tensor([0, 7, 3])

    def compared(self, key):
        raise AssertionError(f"PyG's element-wise is_set({key!r}) was called")

    monkeypatch.setattr(TensorAttr, "is_set", compared)
    got = dict(zip((a.attr_name for a in attrs), features.multi_get_tensor(attrs)))
    assert np.allclose(got["x"].numpy(), graphs["pair" if store == "pair" else "dataset3"].x[[0, 7, 3]])


def test_a_pinning_loader_gathers_its_rows_into_pinned_memory(graphs, allocations, monkeypatch):
    """With ``pin_memory`` and an accelerator (here pretended: this machine has none), each loader thread
    gathers the batch's rows into pinned memory and pins only the rest."""
    import sampling.loader.neighbor_loader

    pinned_batches = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(sampling.loader.neighbor_loader, "pin", lambda batch: pinned_batches.append(batch) or batch)
    g = graphs["dataset3"]
    loader = NeighborLoader(g.data, [3, 3], input_nodes=torch.arange(100), batch_size=25, seed=0,
                            pin_memory=True, loader_threads=2)
    batches = list(loader)
    assert len(batches) == 4 and len(pinned_batches) == 4
    blocks = {t.data_ptr() for _, pin, t in allocations if pin}
    for b in batches:
        assert b.x.data_ptr() in blocks and np.allclose(b.x.numpy(), g.x[b.n_id.numpy()])
    allocations.clear()
    assert len(list(NeighborLoader(g.data, [3, 3], input_nodes=torch.arange(100), batch_size=25, seed=0,
                                   loader_threads=2))) == 4
    assert not any(pin for _, pin, _ in allocations), "a loader without pin_memory gathers into ordinary memory"


# -- the device feeder --

def test_device_feeder_passes_cpu_batches_through(graphs):
    g = graphs["data"]
    loader = NeighborLoader(g.data, [2], batch_size=100, seed=0, loader_threads=2)
    batches = list(loader)
    fed = list(DeviceFeeder(iter(batches), "cpu"))
    assert len(fed) == 4 and all(a is b for a, b in zip(fed, batches))
    assert all(a is b for a, b in zip(DeviceFeeder(batches, None), batches))
    source = iter(loader)
    feeder = DeviceFeeder(source, torch.device("cpu"))
    next(feeder)
    feeder.close()
    assert source.alive() == 0, "closing the feeder closes the loader's iterator"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_device_feeder_copies_pinned_batches_ahead_on_a_side_stream(graphs):
    g = graphs["dataset3"]
    kw = dict(input_nodes=torch.arange(200), batch_size=25, seed=0)
    want = [_view(b) for b in NeighborLoader(g.data, [3, 3], **kw)]
    pinned = NeighborLoader(g.data, [3, 3], pin_memory=True, loader_threads=2, prefetch=1, **kw)
    assert is_pinned(next(iter(pinned))), "the loader threads pin each batch"
    # a loader of its own: a second pass over the same loader is its next epoch, with other samples
    loader = NeighborLoader(g.data, [3, 3], pin_memory=True, loader_threads=2, prefetch=1, **kw)
    device = torch.device("cuda", torch.cuda.current_device())
    got = []
    for batch in DeviceFeeder(iter(loader), device):
        assert batch.x.device == device and batch.edge_index.device == device
        (batch.x.float() @ batch.x.float().T).sum()  # the step, while the next batch is copied
        got.append(_view(batch.cpu()))
    torch.cuda.synchronize()
    assert got == want


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_host_the_loader_threads_gather_rows_into_pinned_memory(graphs, allocations):
    g = graphs["dataset3"]
    loader = NeighborLoader(g.data, [3, 3], input_nodes=torch.arange(100), batch_size=25, seed=0, pin_memory=True,
                            loader_threads=2)
    batches = list(loader)
    blocks = {t.data_ptr() for _, pin, t in allocations if pin and t.is_pinned()}
    assert len(batches) == 4 and all(is_pinned(b) and b.x.data_ptr() in blocks for b in batches)


@pytest.mark.gpu
@needs_cuda
def test_device_feeder_raises_a_source_error_after_the_batch_before_it():
    def source():
        yield torch.arange(4)
        raise RuntimeError("loader broke")

    feeder = DeviceFeeder(source(), "cuda")
    assert next(feeder).tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="loader broke"):
        next(feeder)
    with pytest.raises(StopIteration):
        next(feeder)


# -- rows gathered ahead of the consumer, bounded --

def _next_within(it, seconds: float = 10.0):
    """``next(it)``, failing the test instead of hanging it if the batch never comes (a deadlock)."""
    got = []
    thread = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert got, f"no batch within {seconds} s: the loader threads and the consumer wait for each other"
    return got[0]


def test_batches_ahead_gather_their_rows_only_while_they_fit_and_a_batch_asked_for_always_does():
    """Rows per batch 4, 4, 4, 4, 20, 4 under a bound of 10 rows ahead (one thread, up to 3 batches ahead): while
    the consumer holds batch 0, batches 1 and 2 gather (8 rows) and 3 waits (12 > 10); once the consumer takes 1,
    3 gathers; batch 4 (20 rows, more than the bound alone) waits until the consumer asks for it, then gathers.
    Every batch is sampled before it gathers, and they come in order."""
    from sampling.loader.loader_threads import RowsAhead

    rows = [4, 4, 4, 4, 20, 4]
    gathered, asked, lock = [], [-1], threading.Lock()

    def finish(i):
        with lock:
            gathered.append((i, asked[0]))  # which batch the consumer had asked for when i gathered
        return i * i

    def until(cond):
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # and nothing more gathers meanwhile (checked after)

    it = LoaderThreads(iter(range(len(rows))).__next__, lambda i: i, threads=1, depth=3,
                       ahead=RowsAhead(finish, rows.__getitem__, 10))

    def take(i):
        with lock:
            asked[0] = i
        return _next_within(it)

    assert take(0) == 0
    until(lambda: len(gathered) >= 3)
    assert [g for g, _ in gathered] == [0, 1, 2], "batch 3 would hold 12 rows ahead"
    assert take(1) == 1
    until(lambda: len(gathered) >= 4)
    assert [g for g, _ in gathered] == [0, 1, 2, 3], "batch 4 alone is more than the bound"
    assert [take(i) for i in (2, 3, 4, 5)] == [4, 9, 16, 25]
    assert dict(gathered)[4] == 4, "the 20-row batch gathered once the consumer asked for it, not before"


def test_no_rows_gather_ahead_at_a_bound_of_zero_yet_batches_are_sampled_ahead():
    from sampling.loader.loader_threads import RowsAhead

    sampled, gathered, asked, lock = [], [], [-1], threading.Lock()

    def sample(i):
        with lock:
            sampled.append(i)
        return i

    def finish(i):
        with lock:
            gathered.append((i, asked[0]))
        return i

    it = LoaderThreads(iter(range(5)).__next__, sample, threads=2, depth=1, ahead=RowsAhead(finish, lambda i: 1, 0))
    for i in range(5):
        time.sleep(0.02)  # the consumer trains; the threads may sample ahead but not gather
        with lock:
            asked[0] = i
        assert _next_within(it) == i
    assert all(i == at for i, at in gathered), gathered
    assert len(sampled) == 5
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("backend", ["data", "dataset3"])
def test_a_loader_with_its_rows_ahead_bounded_gives_the_batches_of_one_without(graphs, backend):
    g = graphs[backend]

    def loader(**kw):
        torch.manual_seed(3)
        return NeighborLoader(g.data, [4, 3], input_nodes=torch.arange(150), batch_size=20, shuffle=True, seed=7,
                              **kw)

    plain = [_view(b) for b in loader()]
    for rows in (0, 30, 10**6):
        assert [_view(b) for b in loader(prefetch=2, prefetch_rows=rows)] == plain, rows
    links = torch.from_numpy(np.stack([g.src, g.dst]))[:, :120]
    link = lambda **kw: LinkNeighborLoader(g.data, [3, 2], edge_label_index=links, batch_size=40, seed=7, **kw)
    assert [_view(b) for b in link(loader_threads=2, prefetch_rows=50)] == [_view(b) for b in link()]


def test_a_rows_ahead_bound_that_nothing_would_honour_is_refused(graphs):
    data = graphs["data"].data
    with pytest.raises(InvalidInputError, match="prefetch_rows=5 .*prefetch=0 and one loader thread"):
        NeighborLoader(data, [2], batch_size=10, prefetch_rows=5)
    with pytest.raises(InvalidInputError, match="prefetch_rows=-1 .*integer >= 0"):
        NeighborLoader(data, [2], batch_size=10, prefetch=1, prefetch_rows=-1)
    with pytest.raises(InvalidInputError, match="prefetch_rows=5 .*num_workers"):
        NeighborLoader(data, [2], batch_size=10, prefetch=1, prefetch_rows=5, num_workers=1)
    with pytest.raises(InvalidInputError, match="prefetch_rows=5 .*filter_per_worker=True"):
        NeighborLoader(data, [2], batch_size=10, prefetch=1, prefetch_rows=5, filter_per_worker=True)
    loader = NeighborLoader(data, [2], batch_size=10, prefetch=1, filter_per_worker=False)
    loader.prefetch_rows = 7  # the trainer sets it once it has counted the memory left
    assert loader.prefetch_rows == 7
    with pytest.raises(InvalidInputError, match="filter_per_worker=True"):  # PyG's default for in-memory data
        NeighborLoader(data, [2], batch_size=10, prefetch=1).prefetch_rows = 7
