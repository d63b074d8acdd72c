"""Features larger than memory: --feature-cache trains the same model, counts what it read, and a rank in
a cgroup memory limit smaller than its features trains instead of being killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.training.conftest import ROOT, metrics, run_train, train_cmd

sys.path.insert(0, str(ROOT / "tools"))
import memcgroup  # noqa: E402

FLAGS = ("--nproc", 1, "--epochs", 1, "--fanout", "5,5", "--batch-size", 64, "--seed", 5)


def _epoch(path: Path) -> dict:
    return metrics(path)["epochs"][0]


@pytest.mark.slow
def test_the_ram_and_device_caches_train_the_same_model_and_count_their_hits(synthetic2, tmp_path):
    """Two ranks, two partitions: --feature-cache (hot rows in RAM) and --gpu-cache (on the CPU the device
    cache lives in RAM) draw the same batches as a plain run, so the same loss; each counts its hits, and
    the device cache sends fewer rows over the wire. Sampler processes beside the RAM cache read through it
    (shared with them) and count the same rows, hits and bytes as the rank's own loader thread, over partitions
    read unmapped too; beside the device cache they leave out the rows it holds, as the rank's thread does."""
    runs, outs = {}, {}
    for name, extra in (("plain", ("--feature-cache", "off")), ("ram", ("--feature-cache", "8KB")),
                        ("device", ("--gpu-cache", "16KB")),
                        ("workers", ("--feature-cache", "8KB", "--loader-workers", "1")),
                        ("unmapped", ("--unmapped", "--feature-cache", "8KB", "--loader-workers", "1")),
                        ("device-workers", ("--gpu-cache", "16KB", "--loader-workers", "1"))):
        out = run_train(synthetic2, "--epochs", 1, "--fanout", "5,5", "--batch-size", 64, "--seed", 2, *extra,
                        "--metrics-out", tmp_path / f"{name}.json")
        assert out.returncode == 0, out.stderr
        runs[name], outs[name] = _epoch(tmp_path / f"{name}.json"), out
    plain = runs["plain"]
    for name in ("ram", "device", "workers", "unmapped", "device-workers"):
        assert {k: runs[name][k] for k in ("loss", "train_acc", "val_acc", "test_acc")} == {
            k: plain[k] for k in ("loss", "train_acc", "val_acc", "test_acc")}, name
    assert "features" not in plain and "features" not in runs["device"]
    got = runs["ram"]["features"]
    assert got["cache_bytes"] > 0 and 0 < got["hits"] < got["rows"]
    assert "features: " in outs["ram"].stdout and "B over 2 ranks, hits " in outs["ram"].stdout
    assert got["ranks"] == 2 and got["cache_bytes"] < got["cache_bytes_all"] <= 2 * 8_000  # both ranks' caches
    counted = ("rows", "hits", "disk_bytes", "cache_bytes")
    for name in ("workers", "unmapped"):
        assert {k: runs[name]["features"][k] for k in counted} == {k: got[k] for k in counted}, name
    device = runs["device"]
    assert runs["device-workers"]["gpu_cache"] == device["gpu_cache"]  # a sampler process leaves the same hits out
    assert runs["device-workers"]["wire"]["bytes"]["rows"] == device["wire"]["bytes"]["rows"]
    assert device["gpu_cache"]["hits"] > 0 and 0 < device["gpu_cache"]["rows"] <= 1024  # 16 KB: 1,024 rows of 4 float32s
    assert device["wire"]["bytes"]["rows"] < plain["wire"]["bytes"]["rows"]


def test_sampler_processes_beside_a_device_cache_of_every_row_train_the_same_model(synthetic1, tmp_path):
    """--gpu-cache holding every row a batch reads, beside --loader-workers: each batch brings an x of no rows
    (all from the cache), and the model is the rank's own thread's (that empty x was lost on the way)."""
    runs = {}
    for name, extra in (("thread", ()), ("workers", ("--loader-workers", "1"))):
        out = run_train(synthetic1, "--nproc", 1, "--epochs", 1, "--fanout", "5,5", "--batch-size", 64, "--seed", 2,
                        "--gpu-cache", "1MB", *extra, "--metrics-out", tmp_path / f"{name}.json")
        assert out.returncode == 0, out.stderr
        runs[name] = _epoch(tmp_path / f"{name}.json")
    assert runs["workers"]["loss"] == runs["thread"]["loss"]
    assert runs["workers"]["gpu_cache"] == runs["thread"]["gpu_cache"]
    assert runs["workers"]["gpu_cache"]["misses"] == 0 < runs["workers"]["gpu_cache"]["hits"]


def test_a_bad_feature_cache_size_is_refused_in_one_line(synthetic1):
    done = run_train(synthetic1, "--feature-cache", "lots")
    assert done.returncode == 2
    assert "--feature-cache" in done.stderr and len(done.stderr.strip().splitlines()) <= 3


def _big_source(folder: Path, n: int = 150_000, width: int = 1024):
    """``n`` nodes with ``width`` float32 features (600 MB, written through a file: the test holds none of
    it), 5 random in-edges each, 1% train / 0.5% val / 0.5% test."""
    import numpy as np

    from graphstore.ingest import ArrayRows, EdgeTable, GraphSource, NodeTable

    rng = np.random.default_rng(2)
    x = np.memmap(folder / "x.f32", dtype=np.float32, mode="w+", shape=(n, width))
    for lo in range(0, n, 10_000):
        x[lo:lo + 10_000] = rng.standard_normal((min(10_000, n - lo), width), dtype=np.float32)
    x.flush()
    y = rng.integers(0, 4, n)
    slot = np.arange(n) % 200
    masks = {"train_mask": slot < 2, "val_mask": slot == 2, "test_mask": slot == 3}
    attrs = {"x": ArrayRows(x), "y": ArrayRows(y), **{k: ArrayRows(v) for k, v in masks.items()}}
    dst = np.repeat(np.arange(n), 5)
    return GraphSource({None: NodeTable(n, attrs)}, {None: EdgeTable(rng.integers(0, n, len(dst)), dst)})


@pytest.mark.slow
@pytest.mark.skipif(memcgroup.available() is not None, reason=str(memcgroup.available()))
def test_a_rank_in_a_memory_limit_smaller_than_its_features_reads_them_from_disk(tmp_path):
    """600 MB of features, the job (launcher and rank) limited to 1.1 GB, page cache included (torch
    alone takes ~0.3 GB a process): the rank reads rows from disk by itself (automatic), keeps its hottest rows
    in RAM in what the limit leaves, is not killed, trains the same model as without the limit and writes the
    same outputs of every node (``--infer-out``: x read batch by batch, never whole); so does the job with a
    sampler process beside the rank."""
    import graphstore
    import torch

    data = tmp_path / "big"
    graphstore.ingest(_big_source(tmp_path), data, num_parts=1)
    (tmp_path / "x.f32").unlink()
    free = run_train(data, *FLAGS, "--feature-cache", "off", "--infer-out", "h_free", "--metrics-out",
                     tmp_path / "free.json")
    assert free.returncode == 0, free.stderr
    memcgroup.drop_from_page_cache(data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with memcgroup.MemoryCgroup(1_100_000_000) as group:
        done = subprocess.run(train_cmd(data, *FLAGS, "--infer-out", "h", "--metrics-out", tmp_path / "limited.json"),
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=group.join)
        memcgroup.drop_from_page_cache(data)
        workers = subprocess.run(train_cmd(data, *FLAGS, "--loader-workers", 1, "--metrics-out", tmp_path / "w.json"),
                                 env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=group.join)
        # batches of up to 499,712 rows (2.9 GB with the model's share; GraphSAGE in blocks: a row per node and one
        # per aggregate) cannot fit: refused before training, in one line, not killed
        wide = subprocess.run(train_cmd(data, "--nproc", 1, "--epochs", 1, "--fanout", "10,10", "--batch-size", 4096),
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=group.join)
        kills = group.oom_kills()
    assert done.returncode == 0 and workers.returncode == 0 and kills == 0, done.stderr + workers.stderr
    assert wide.returncode == 2 and "epoch 1/1" not in wide.stdout, wide.stderr
    refusal = [line for line in wide.stderr.splitlines() if "needs about" in line]
    assert len(refusal) == 1 and refusal[0].startswith("graphstore-train: error: rank 0: memory: "), wide.stderr
    assert "--batch-size 4096 --fanout 10,10: up to 499,712 feature rows of 4,096 bytes" in refusal[0]
    assert "exceeds half of its memory" in done.stderr
    # every node's outputs, written in the limit (x twice its half, as the refusal before streaming it counted)
    # equal to those of the job without it
    from graphstore.dataset.whole import DatasetFeatureStore

    outputs = DatasetFeatureStore(graphstore.open_dataset(data))
    h, h_free = outputs[None, "h", None], outputs[None, "h_free", None]
    assert h.shape == (150_000, 4) and torch.allclose(h, h_free, atol=1e-5), float((h - h_free).abs().max())
    a, b = _epoch(tmp_path / "free.json"), _epoch(tmp_path / "limited.json")
    assert (a["loss"], a["train_acc"], a["val_acc"]) == (b["loss"], b["train_acc"], b["val_acc"])
    # its hottest rows in RAM in what the limit leaves beside its batches: more than none, less than half the limit
    assert b["features"]["disk_bytes"] > 0 and 0 < b["features"]["cache_bytes"] <= 550_000_000
    assert b["features"]["hits"] > 0 and "the hottest rows of x in RAM" in done.stderr
    # a sampler process beside the rank: its batches counted in the room, the cache shared with it, the same model
    w = _epoch(tmp_path / "w.json")
    assert (w["loss"], w["train_acc"], w["val_acc"]) == (a["loss"], a["train_acc"], a["val_acc"])
    assert w["features"]["rows"] == b["features"]["rows"] and w["features"]["hits"] > 0
    assert "the sampler processes' batches, in shared memory" in workers.stderr


def test_a_batch_holds_a_row_per_sampled_node_and_edge_at_most():
    from training.loop.featurecache import batch_rows_bound

    assert batch_rows_bound(1, (2,)) == 1 + 2 + 2  # the seed, its two neighbours, the two edges
    assert batch_rows_bound(1024, (10, 5)) == 1024 * (1 + 10 + 50) + 1024 * (10 + 50)
    assert batch_rows_bound(8, (10, -1)) is None  # every neighbour: no bound
    # a model in blocks (sparse aggregation): the first layer's aggregate per destination, every hop but the last
    assert batch_rows_bound(1024, (10, 5), edge_rows=False) == 1024 * (1 + 10 + 50) + 1024 * (1 + 10)


def test_a_1gb_limit_refuses_pygs_gather_but_fits_the_block_models(monkeypatch):
    """The job of issue 47 (batch 1024, fanout 10,5, rows of 4 KiB, 0.4 GB in use) in a 1.0 GB limit: refused
    with a model that gathers a row per edge, trained with the built-in GraphSAGE or GIN on CPU; which one the
    trainer counts follows the task and the model."""
    from types import SimpleNamespace

    from training.loop import featurecache as fc
    from training.loop.tasks import LinkTask, NodeTask

    monkeypatch.setattr(fc, "cgroup_memory", lambda: (1_000_000_000, 400_000_000))
    with pytest.raises(Exception, match="needs about 1.11 GB.*a row per sampled node and edge"):
        fc.check_room(1024, (10, 5), 4096, 1, "flags")
    ahead = fc.check_room(1024, (10, 5), 4096, 1, "flags", edge_rows=False)
    assert ahead == (1_000_000_000 - 400_000_000 - int(73_728 * 4096 * fc.PEAK_SHARE)) // 4096 > 0

    def task(model, hetero=False, cuda=False):
        t = NodeTask.__new__(NodeTask)
        t.t, t.hetero = SimpleNamespace(config=SimpleNamespace(model=model), world=SimpleNamespace(use_cuda=cuda)), hetero
        return t.edge_rows

    assert (task("sage"), task("gin")) == (False, False)
    assert task("gat") and task("gcn") and task("mine:build") and task("sage", hetero=True) and task("sage", cuda=True)
    assert LinkTask.edge_rows



def test_the_rows_a_short_rank_gathers_ahead_are_what_its_limit_leaves_beside_its_batches(monkeypatch):
    """check_room's answer: 1.5 GB limit, 0.4 GB in use, a worst batch of 123,904 rows of 4 KiB (x1.4 for the
    model): the rest, in rows, for the batches ahead; shared by the local ranks; refused when nothing is left;
    without a cgroup, from the host's available memory; none with a fanout of -1."""
    from training.loop import featurecache as fc

    batch = int(123_904 * 4096 * fc.PEAK_SHARE)
    monkeypatch.setattr(fc, "cgroup_memory", lambda: (1_500_000_000, 400_000_000))
    ahead = fc.check_room(1024, (10, 5), 4096, 1, "flags")
    assert ahead == (1_500_000_000 - 400_000_000 - batch) // 4096 and 90_000 < ahead < 100_000
    assert fc.check_room(512, (10, 5), 4096, 1, "flags") > ahead  # smaller batches leave more
    with pytest.raises(Exception, match="needs about 1.82 GB"):  # two ranks' batches do not fit
        fc.check_room(1024, (10, 5), 4096, 2, "flags")
    assert fc.check_room(8, (10, -1), 4096, 1, "flags") == 0
    monkeypatch.setattr(fc, "cgroup_memory", lambda: None)
    monkeypatch.setattr("sampling.warmup.runner.available_memory", lambda: 2_000_000_000)
    assert fc.check_room(1024, (10, 5), 4096, 2, "flags") == (2_000_000_000 - 2 * batch) // 2 // 4096
    monkeypatch.setattr("sampling.warmup.runner.available_memory", lambda: 1_000_000_000)
    assert fc.check_room(1024, (10, 5), 4096, 2, "flags") == 0  # no refusal without a limit, and nothing ahead


class _Rows:
    """A row reader's size and kept rows, without the rows (fill_what_is_left sizes, it does not read)."""

    cache = None

    def __init__(self, n: int, row_bytes: int) -> None:
        self.n, self.row_bytes, self.kept = n, row_bytes, 0

    def __len__(self) -> int:
        return self.n

    def keep_hot(self, hot, shared=False) -> None:
        self.kept, self.shared = len(hot), shared

    @property
    def cache_bytes(self) -> int:
        return self.kept * self.row_bytes


def test_an_automatic_cache_takes_what_the_limit_leaves_beside_the_batches_and_their_margin(monkeypatch):
    """feature_cache left out: once the batches' room is known, the hottest rows fill what the 1.5 GB limit
    leaves beside what is in use, the batch in training, one batch gathered ahead and 10% of the limit; the
    rows gathered ahead shrink by the cache's; once only; a size given (or a tight limit) keeps none."""
    import numpy as np

    from training.loop import featurecache as fc

    def reader(automatic=True, parts=(600_000, 400_000)):
        readers = [_Rows(n, 4096) for n in parts]
        return fc.FeatureReader(readers, 0, automatic=automatic, short=True, row_bytes=4096,
                                hot_sets=[lambda budget: np.arange(budget // 4096)] * len(readers))

    monkeypatch.setattr(fc, "cgroup_memory", lambda: (1_500_000_000, 400_000_000))
    monkeypatch.setattr(fc, "memory_limit", lambda ranks: 1_500_000_000)
    ahead = fc.check_room(1024, (10, 5), 4096, 1, "flags", edge_rows=False)
    features = reader()
    left = fc.fill_what_is_left(features, ahead, 1024, (10, 5), 1, batches_ahead=1)
    batch, nodes = int(73_728 * 4096 * fc.PEAK_SHARE), 62_464 * 4096  # in training; gathered ahead
    cache = features.cache_bytes
    assert 0.2e9 < cache and 400_000_000 + batch + nodes + cache + 150_000_000 <= 1_500_000_000
    left_over = 1_500_000_000 - (400_000_000 + batch + nodes + cache + 150_000_000)
    assert left_over < 4 * 4096  # all of what is left, rounded down to rows
    assert [round(r.cache_bytes / cache, 4) for r in features.readers] == [0.6, 0.4]  # split by the readers' rows
    assert left == ahead - cache // 4096 - 150_000_000 // 4096 and 62_464 <= left < 62_464 + 4  # one batch ahead
    assert fc.fill_what_is_left(features, left, 1024, (10, 5), 1, 1) == left and features.cache_bytes == cache
    given = reader(automatic=False)  # --feature-cache SIZE (or 0): kept as given
    assert fc.fill_what_is_left(given, ahead, 1024, (10, 5), 1, 1) == ahead and given.cache_bytes == 0
    small = reader(parts=(10_000,))  # own x smaller than what is left: all of it
    fc.fill_what_is_left(small, ahead, 1024, (10, 5), 1, 1)
    assert small.cache_bytes == 10_000 * 4096
    monkeypatch.setattr(fc, "cgroup_memory", lambda: (1_500_000_000, 800_000_000))  # 0.8 GB in use: too little
    tight = reader()
    ahead = fc.check_room(1024, (10, 5), 4096, 1, "flags", edge_rows=False)
    assert fc.fill_what_is_left(tight, ahead, 1024, (10, 5), 1, 1) == ahead and tight.cache_bytes == 0
    assert fc.fill_what_is_left(reader(), ahead, 8, (10, -1), 1, 1) == ahead  # no bound on a batch: none


def test_a_session_short_of_memory_reads_x_from_disk_gathers_ahead_within_its_limit_and_counts_it(synthetic1, tmp_path):
    """training.Session, as graphstore-train: a rank whose own x exceeds half of its memory (the memory made
    small in the script) reads x from disk by itself, its hottest rows in RAM in what is left once its first
    loader is made; its loader defaults to one thread and a batch ahead bounded by what the limit leaves,
    yields the stored rows, and feature_stats() counts them; so does a loader of sampler processes, which read x
    as the rank does (the rank's cache moved to shared memory); a batch that cannot fit in the limit, with or
    without them, is refused in one line when the loader is made."""
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch
        import graphstore
        from graphstore.errors import GraphstoreError
        from training import Session
        from training.loop import featurecache as fc

        fc.memory_limit = lambda ranks: 40_000  # own x: 2,000 rows of 16 bytes, more than half of it
        fc.MIN_CACHE = 0  # so the cache it sizes at its first loader is kept: half of that memory, 20 KB at most
        stored = graphstore.open_dataset(sys.argv[1]).partition(0)[0][None, "x", None]  # one partition: global IDs
        said = {}
        with Session(sys.argv[1], seed=3, loader_workers=1) as s:  # forked now; loaders without them say 0
            loader = s.loader([5, 5], input_nodes="train_mask", batch_size=100, shuffle=True, num_workers=0)
            said["short"] = [s.features.short, s.features.cache_bytes]
            said["options"] = [loader.inner.loader_threads, loader.inner.prefetch, loader.inner.prefetch_rows]
            rows, same = 0, True
            for b in loader:
                rows += b.x.shape[0]
                same = same and torch.equal(b.x, stored[b.n_id])
            said.update(rows=rows, same=same, stats=s.feature_stats(), again=s.feature_stats())
            ends = torch.tensor([[0, 1, 2, 3] * 25, [4, 5, 6, 7] * 25])
            links = s.link_loader([5, 5], split=None, edge_label_index=ends, neg_sampling="binary", batch_size=20,
                                  num_workers=0)
            said["links"] = [links.inner.loader_threads, links.inner.prefetch, links.inner.prefetch_rows,
                             all(torch.equal(b.x, stored[b.n_id]) for b in links)]
            s.feature_stats()
            # a sampler process reads x as the rank does (from disk, the rank's cache moved to shared memory)
            workers = s.loader([5, 5], input_nodes="train_mask", batch_size=100)
            got = [(b.x.shape[0], torch.equal(b.x, stored[b.n_id])) for b in workers]
            said["workers"] = [sum(n for n, _ in got), all(ok for _, ok in got), s.feature_stats(),
                               s.features.readers[0].cache.is_shared()]
            fc.cgroup_memory = lambda: (1_000_000_000, 999_900_000)  # a limit with 100 KB left
            try:
                s.loader([5, 5], input_nodes="train_mask", batch_size=100)
            except GraphstoreError as exc:
                said["refused_workers"] = str(exc)
            try:
                s.loader([5, 5], input_nodes="train_mask", batch_size=100, num_workers=0)
            except GraphstoreError as exc:
                said["refused"] = str(exc)
        print(json.dumps(said))
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script), str(synthetic1)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert "exceeds half of its memory" in out.stderr
    assert said["short"][0] and 0 < said["short"][1] <= 20_000  # the hottest rows, in what is left (capped)
    threads, prefetch, ahead = said["options"]
    assert (threads, prefetch) == (1, 1) and ahead > 0  # no cgroup here: what MemAvailable leaves beside a batch
    assert said["same"] and said["rows"] > 0
    stats = said["stats"]
    assert stats["rows"] == said["rows"] and 0 < stats["hits"] < said["rows"] and stats["disk_bytes"] > 0
    assert stats["cache_bytes"] == said["short"][1]
    assert said["again"]["rows"] == 0  # counted since the last call
    assert said["links"][:2] == [1, 1] and said["links"][2] > 0 and said["links"][3]  # a link loader: the same
    assert "needs about 1.00 GB" in said["refused"] and "batch_size=100, num_neighbors=[5, 5]" in said["refused"]
    assert said["refused"].endswith("a smaller batch_size or num_neighbors")
    rows, same, stats, shared = said["workers"]
    assert same and rows > 0 and shared  # the worker's batches hold the stored rows; the cache is in shared memory
    assert stats["rows"] == rows and 0 < stats["hits"] < rows  # counted by the worker, as the rank's readers'
    assert "for 1 sampler process(es) and their batches" in said["refused_workers"]


def test_a_ranks_memory_is_its_share_of_the_limit_its_local_ranks_share(monkeypatch):
    """The launcher's ranks (a SLURM step's, a container's) share its cgroup: each may use its share of the
    limit, as of the host's memory without one; the automatic switch to disk reads follows that share."""
    import os as _os

    from training.loop import featurecache as fc

    host = _os.sysconf("SC_PAGE_SIZE") * _os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setattr(fc, "_cgroup_limits", lambda: [])
    assert fc.memory_limit(1) == host and fc.memory_limit(4) == host // 4
    monkeypatch.setattr(fc, "_cgroup_limits", lambda: [("/sys/fs/cgroup/memory/job", 2_500_000_000)])
    assert fc.memory_limit(1) == min(host, 2_500_000_000)
    assert fc.memory_limit(2) == min(host, 2_500_000_000) // 2  # 1 GB of own x each: past half of 1.25 GB


def test_sampler_processes_count_their_batches_in_the_room_and_share_the_cache_the_rank_sizes(monkeypatch):
    """With sampler processes a rank holds their batches in flight (two each, in blocks a quarter larger, and
    the rank's copies) and their own memory: check_room counts them (refused, naming them, where they do not
    fit), and the cache the rank sizes in what is left goes to shared memory, where they read it too."""
    import numpy as np

    from graphstore.errors import InvalidInputError
    from training.loop import featurecache as fc

    monkeypatch.setattr(fc, "cgroup_memory", lambda: (1_500_000_000, 400_000_000))
    monkeypatch.setattr(fc, "memory_limit", lambda ranks: 1_500_000_000)
    monkeypatch.setattr("sampling.loader.sampler_processes.idle", lambda: 2)  # forked at the rank's start
    alone = fc.check_room(256, (5, 5), 4096, 1, "flags", edge_rows=False)
    held = fc.worker_bytes(2, 256, (5, 5), 4096)
    assert held == 2 * (int(4.5 * 7_936 * 4096) + fc.WORKER_BYTES)  # 7,936 rows a batch at most
    assert fc.check_room(256, (5, 5), 4096, 1, "flags", edge_rows=False, workers=2) == alone - held // 4096
    assert fc.worker_bytes(0, 256, (5, 5), 4096) == fc.worker_bytes(2, 256, (5, -1), 4096) == 0
    assert fc.worker_bytes(2, 256, (5, 5), 4096, late=1) == held + fc.LATE_WORKER_BYTES
    monkeypatch.setattr("sampling.loader.sampler_processes.idle", lambda: 1)  # one forked at the start, one late
    assert fc.check_room(256, (5, 5), 4096, 1, "flags", edge_rows=False, workers=2) == \
        alone - (held + fc.LATE_WORKER_BYTES) // 4096
    monkeypatch.setattr("sampling.loader.sampler_processes.idle", lambda: 2)
    with pytest.raises(InvalidInputError, match=r"needs about 3\.\d\d GB .*and 2\.44 GB a rank for 2 sampler "
                                                r"process\(es\) and their batches\); .*--fanout, or fewer sampler "
                                                r"processes$"):
        fc.check_room(1024, (10, 5), 4096, 1, "flags", edge_rows=False, workers=2)
    readers = [_Rows(600_000, 4096)]
    features = fc.FeatureReader(readers, 0, automatic=True, short=True, row_bytes=4096,
                                hot_sets=[lambda budget: np.arange(budget // 4096)])
    ahead = fc.check_room(256, (5, 5), 4096, 1, "flags", edge_rows=False, workers=2)
    fc.fill_what_is_left(features, ahead, 256, (5, 5), 1, 0, shared=True)
    assert readers[0].shared and 0 < features.cache_bytes <= ahead * 4096 - 150_000_000
