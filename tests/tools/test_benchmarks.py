"""The benchmarks in tools/ still run end to end on tiny inputs, report what docs/performance.md quotes, and leave
their JSON record in the folder ``--record`` names (never in the repo's benchmarks/)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

import graphstore
from tests.conftest import shared_data

ROOT = Path(__file__).resolve().parents[2]
TINY = "synthetic:nodes=4000,avg_degree=8,features=8,classes=3,train=0.2,val=0.05,seed=0"
RECORD_KEYS = ("benchmark", "config", "command", "commit", "date", "machine", "parameters", "figures", "provenance")


def _repo_records() -> set[Path]:
    return set((ROOT / "benchmarks").glob("*/*.json"))


def _run(tool: str, tmp_path: Path, *args: str) -> dict:
    """``tools/<tool>.py --json --record TMP ARGS`` in a child process (as a user runs it): its JSON output,
    after checking the record it wrote under TMP."""
    records, before = tmp_path / "records", _repo_records()
    cmd = [sys.executable, str(ROOT / "tools" / f"{tool}.py"), "--json", "--record", str(records), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    # every bench reports the machine it ran on and the seed of its random draws (also first on stderr)
    assert out["machine"]["logical_cores"] >= 1 and out["machine"]["ram_gib"] > 0 and out["machine"]["torch"]
    assert done.stderr.startswith(f"machine: {out['machine']['cpu']}") and f"seed {out['seed']}" in done.stderr
    _check_record(tool, records, out, cmd)
    assert _repo_records() == before, "a smoke run wrote into the repo's benchmarks/"
    return out


def _check_record(tool: str, records: Path, out: dict, cmd: list[str]) -> None:
    """One record, named <UTC date>-<short commit>.json, with every key, the run's argv and its figures."""
    [path] = list((records / tool).glob("*.json"))
    rec = json.loads(path.read_text())
    assert tuple(rec) == RECORD_KEYS and rec["benchmark"] == tool and rec["provenance"] is None
    assert rec["command"][1:] == cmd[1:] and isinstance(rec["config"], dict)
    date = datetime.fromisoformat(rec["date"])
    assert date.utcoffset().total_seconds() == 0 and path.name.startswith(rec["date"][:10])
    assert rec["commit"] is None or (len(rec["commit"].split("+")[0]) == 40 and path.stem[11:18] == rec["commit"][:7])
    assert rec["machine"] == out["machine"] and "gpus" in rec["machine"] and rec["parameters"]["seed"] == out["seed"]
    assert not {"json", "record", "no_record"} & set(rec["parameters"])
    assert set(rec["figures"]) == set(out) - {"machine", "seed"}


@pytest.mark.slow
def test_bench_sampler_reports_every_row(tmp_path):
    out = _run("bench_sampler", tmp_path, "--data", str(tmp_path / "ds"), "--spec", TINY, "--parts", "2",
               "--batches", "3", "--repeats", "1", "--batch-size", "64")
    assert (out["graph"]["nodes"], out["graph"]["parts"]) == (4000, 2) and out["graph"]["edges"] > 0
    for row in ("ours", "ours_unpacked", "ours_per_hop_driver", "ours_with_features", "torch_reference"):
        assert out[row]["edges_per_s"] > 0 and out[row]["batches_per_s"] > 0, row
    assert set(out["loader_batches_per_s_by_workers"]) == {"0", "2", "2, rows fetched in the workers"}
    assert set(out["disjoint_loader_batches_per_s_by_workers"]) == {"0", "2"}
    assert out["speedup_vs_torch_reference"] == pytest.approx(
        out["ours"]["edges_per_s"] / out["torch_reference"]["edges_per_s"])
    assert out["pyg_lib"] is None or out["pyg_lib"]["edges_per_s"] > 0


@pytest.mark.slow
def test_bench_variants_measures_every_variant_on_a_matrix_of_shapes_and_names_the_worst(tmp_path):
    out = _run("bench_variants", tmp_path, "--nodes", "3000", "--edges", "30000", "--batches", "2", "--repeats", "1",
               "--batch-size", "64", "--mag-papers", "2000", "--fanout", "6,4,2", "--fanout", "8,8")
    assert out["fanouts"] == [[6, 4, 2], [8, 8]] and out["degrees"] == ["uniform", "skewed"]  # the matrix by default
    assert out["source"] == "dataset"  # the path users run, by default
    rows = {(r["shape"], r["variant"]): r for r in out["shapes"]}
    times = ("early", "middle", "late", "spread")
    for degrees in ("uniform", "skewed"):
        for fanout in ("6,4,2", "8,8"):
            shape = f"{degrees}/{fanout}"
            for name in ("plain", "weighted", "disjoint", "masked", "link", "distributed"):
                assert rows[shape, name]["edges_per_s"] > 0, (shape, name)
                # the masked ones also against the plain path over the train links they may sample
                assert ("ratio_to_eligible_plain" in rows[shape, name]) == (name in ("masked", "link")), (shape, name)
            for name in ("temporal_uniform", "temporal_last"):
                for when in times:
                    row = rows[f"{shape}/{when}", name]
                    assert row["seed_time"] == when and row["edges_per_s"] > 0
                    # against the plain path over the edges eligible at that time (every edge, late; none: spread)
                    assert ("ratio_to_eligible_plain" in row) == (when != "spread"), (shape, when, name)
                late = rows[f"{shape}/late", name]
                assert late["ratio_to_eligible_plain"] == pytest.approx(late["ratio_to_plain"])
            plain = rows[shape, "plain"]["edges_per_s"]
            assert all(r["ratio_to_plain"] == pytest.approx(r["edges_per_s"] / plain) for r in out["shapes"]
                       if r["degrees"] == degrees and r["fanout"] == [int(v) for v in fanout.split(",")])
    assert {r["degrees"] for r in out["shapes"] if r["variant"] == "hetero"} == {"uniform"}  # a graph of its own
    lowest = {}
    for r in out["shapes"]:
        if r["variant"] not in ("plain", "hetero"):
            lowest[r["variant"]] = min(lowest.get(r["variant"], 9e9), r["ratio_to_plain"])
    assert {k: v["ratio_to_plain"] for k, v in out["worst"].items()} == lowest
    assert all(rows[w["shape"], k]["ratio_to_plain"] == w["ratio_to_plain"] for k, w in out["worst"].items())


@pytest.mark.slow
def test_bench_variants_compares_the_dataset_with_memory_and_refuses_pyg_lib_it_cannot_load(tmp_path):
    out = _run("bench_variants", tmp_path, "--nodes", "2000", "--edges", "20000", "--batches", "2", "--repeats", "1",
               "--batch-size", "64", "--variants", "plain,weighted,temporal_last", "--source", "both",
               "--threads", "1,2", "--cold", "--degrees", "skewed", "--seed-times", "late", "--fanout", "4,4")
    assert out["cold"] is True  # the dataset opened again with its files evicted from the page cache
    rows = {r["variant"]: r for r in out["shapes"]}
    assert set(rows) == {"plain", "weighted", "temporal_last"}
    assert rows["temporal_last"]["shape"] == "skewed/4,4/late"
    for row in rows.values():
        assert row["ratio_to_memory"] > 0 and row["ratio_with_2_threads"] > 0
    assert out["worst"]["temporal_last"]["ratio_to_memory_worst"] == rows["temporal_last"]["ratio_to_memory"]
    try:
        import pyg_lib  # noqa: F401
    except ImportError:  # the refusal comes before anything is built: its main, in this process
        from tests.tools.conftest import load_tool

        with pytest.raises(SystemExit) as refused:
            load_tool("bench_variants").main(["--no-record", "--pyg-lib", "--nodes", "100", "--edges", "500"])
        said = str(refused.value.code)  # what a SystemExit of a string prints, as the one line on stderr
        assert "--pyg-lib needs pyg-lib" in said and "tools/build_pyglib.sh" in said


@pytest.mark.slow
def test_bench_store_and_bench_remote_report_ratios(tmp_path):
    store = _run("bench_store", tmp_path, "--nodes", "5000", "--features", "8", "--repeats", "1", "--parts", "2",
                 "--data", str(tmp_path / "g"))
    assert [g["batch"] for g in store["gather"]][:2] == [1024, 10000]
    assert all(g["store_ms"] > 0 and g["speed_vs_ram"] > 0 for g in store["gather"])
    remote = _run("bench_remote", tmp_path, "--nodes", "5000", "--features", "8", "--latency-ms", "1", "--repeats", "1",
                  "--data", str(tmp_path / "r"))
    assert remote["setup"]["latency_ms"] == 1.0 and remote["gathers"]
    assert all(g["cold_requests"] == g["chunks_touched_last"] > 0 for g in remote["gathers"])  # each chunk fetched once


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_train_runs_two_ranks_and_their_loader_alone(tmp_path):
    out = _run("bench_train", tmp_path, "--ranks", "2", "--spec", TINY, "--epochs", "2", "--batch-size", "128",
               "--data", str(tmp_path / "t"))
    [r] = out["runs"]
    assert r["ranks"] == 2 and r["remote_requests"] > 0  # two partitions: the ranks ask each other
    assert r["steps"] > 0 and 0.0 <= r["test_acc"] <= 1.0
    assert r["compute_per_step"] > 0 and r["data_wait_per_step"] >= 0
    assert len(r["peak_rss_mb_per_epoch"]) == 2 and len(r["peak_rss_mb_per_epoch"][0]) == 2
    own = r["memory_mb"]["peak_rss"]  # the trainer's own report agrees with the tool's polling
    assert r["peak_rss_mb_largest"] <= max(own) * 1.25 + 50 and max(own) > 0, (own, r["peak_rss_mb_largest"])
    loader = r["loader_only"]
    assert len(loader["loader_batches_per_s"]) == 2 and min(loader["loader_batches_per_s"]) > 0
    assert loader["compute_per_step"] == 0


def test_bench_train_gives_an_epoch_that_ends_after_the_last_poll_the_window_before_it(tmp_path, monkeypatch):
    from tests.tools.conftest import load_tool

    tool = load_tool("bench_train")
    metrics, rss = tmp_path / "m.json", iter([100, 200])

    class Job:  # polled twice while running; epochs 1-2 written before the second poll, 3 after it
        pid, calls = 1, 0

        def poll(self):
            self.calls += 1
            if self.calls >= 2:
                metrics.write_text(json.dumps({"epochs": [{}] * (2 if self.calls == 2 else 3)}))
            return None if self.calls < 3 else 0

    class Rank:
        pid = 7

        def memory_info(self):
            return type("M", (), {"rss": next(rss)})()

    monkeypatch.setattr(tool.benchinfo, "rank_processes", lambda pid: [Rank()])
    assert tool.poll_peaks(Job(), metrics, interval=0) == [[200], [200], [200]]


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_train_compares_with_a_baseline_checkout(tmp_path):
    """One rank (one partition, so no remote request): the five variants are five jobs."""
    out = _run("bench_train", tmp_path, "--case", "compare", "--ranks", "1", "--spec", "pairs:nodes=3000,pairs=20000,"
               "features=8,classes=4,seed=1", "--epochs", "3", "--batch-size", "256", "--hidden", "16",
               "--baseline-tree", str(ROOT), "--data", str(tmp_path / "t"))
    names = [v["variant"] for v in out["variants"]]
    assert names[0].startswith("baseline") and "GRAPHSTORE_MALLOC=glibc" in names[2]
    assert "GRAPHSTORE_MALLOC=default" in names[3] and "loader" in names[4]
    assert [v["runs"][0]["allocator"] for v in out["variants"][2:4]] == ["glibc-tuned", "system"]
    for v in out["variants"]:
        run = v["runs"][0]
        assert len(run["peak_rss_mb_per_epoch"]) == 3 and run["peak_growth_after_epoch_2"] > 0
        assert run["ranks"] == 1 and run["remote_requests"] == 0
        assert v["speed_vs_first"] > 0
    assert out["variants"][0]["speed_vs_first"] == 1.0


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_cluster_runs_two_rig_hosts_and_loopback(tmp_path):
    import os

    from tests.cluster import require_rig, rig_unavailable

    require_rig(rig_unavailable(), dict(os.environ))
    out = _run("bench_cluster", tmp_path, "--hosts", "2", "--rates", "1gbit", "--spec", TINY, "--epochs", "1",
               "--batch-size", "128", "--data", str(tmp_path / "c"))
    rows = {r["link"]: r for r in out["rows"]}
    assert set(rows) == {"loopback", "1gbit"} and rows["loopback"]["speed_vs_loopback"] == 1.0
    assert all(len(r["mb_per_host"]) == 2 and min(r["mb_per_host"]) > 0 for r in rows.values())
    assert rows["1gbit"]["bytes"]["rows"] > 0 and rows["1gbit"]["bytes"]["allreduce"] > 0
    m = out["minimum"]["2"]
    assert m["counted_bytes"] >= m["needed_bytes"] > 0, "the counted payload can never be below what was needed"


@pytest.mark.slow
def test_bench_partition_reports_every_constraint_before_and_after(tmp_path):
    shared_data("planetoid", "Cora", "raw")  # the tool reads Cora from ../shared/data
    # A fixed seed: METIS's result (and so the "before" imbalance) depends on it.
    out = _run("bench_partition", tmp_path, "--graphs", "cora", "--parts", "2", "4", "--seed", "1")
    rows = {(r["parts"], r["run"]): r for r in out["rows"]}
    assert set(rows) == {(2, "before"), (2, "after"), (4, "before"), (4, "after")}
    for (k, run), r in rows.items():
        assert {"nodes", "train", "edges", "cut", "scheme", "moved"} <= set(r)
        if run == "after":
            assert max(r["nodes"], r["train"], r["edges"]) <= 1.05 and r["scheme"] in ("kway", "recursive")
    before = [max(r["nodes"], r["train"], r["edges"]) for (k, run), r in rows.items() if run == "before"]
    assert max(before) > 1.05  # the old weights miss some constraint on Cora: the table compares something


@pytest.mark.slow
def test_bench_trim_times_every_trimmed_model(tmp_path):
    out = _run("bench_trim", tmp_path, "--nodes", "2000", "--steps", "2", "--batch-size", "64", "--hidden", "16",
               "--shapes", "8:4,3;16:5")
    assert [(r["features"], r["fanout"], r["model"]) for r in out["rows"]] == [
        (f, fanout, m) for f, fanout in ((8, [4, 3]), (16, [5])) for m in ("sage", "gat", "gin")]
    assert all(r["untrimmed_ms"] > 0 and r["trimmed_ms"] > 0 and r["blocks_ms"] > 0 for r in out["rows"])


@pytest.mark.slow
def test_bench_unmapped_times_kept_unmapped_and_pread_pages(tmp_path):
    dest = tmp_path / "ds"
    graphstore.ingest(TINY, dest, num_parts=1)
    out = _run("bench_unmapped", tmp_path, str(dest), "--every", "1", "--batches", "3", "--repeats", "1",
               "--batch-size", "64", "--seed", "2")
    kept, unmapped, pread = out["rows"]
    assert (kept["every"], unmapped["every"], pread["every"]) == (0, 1, -1) and kept["x_kept"] == 1.0
    assert kept["ms_per_batch"] > 0 and unmapped["ms_per_batch"] > 0 and kept["edges_per_batch"] > 0
    # the same draws every way; the unmapping really unmaps (the next batch maps pages again); pread maps nothing
    assert unmapped["edges_per_batch"] == kept["edges_per_batch"] == pread["edges_per_batch"]
    assert kept["after_unmapping_mb"] is None and unmapped["after_unmapping_mb"] == 0
    assert 0 < unmapped["most_mapped_mb"] <= kept["most_mapped_mb"]
    assert pread["most_mapped_mb"] == 0 and pread["ms_per_batch"] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_ingest_runs_both_engines_and_verifies(tmp_path):
    out = _run("bench_ingest", tmp_path, "--graphs", "synthetic:nodes=20000,avg_degree=6,features=4,classes=3",
               "--parts", "2", "--workers", "1", "--memory-limit", "1GB", "--verify", "--seed", "3")
    assert [r["engine"] for r in out["rows"]] == ["local", "dask"]
    for row in out["rows"]:
        assert row["edges"] == 120_000 and row["verify"] == "ok" and row["peak_rss_gb"] > 0 and row["seconds"] > 0
    assert out["rows"][0]["edge_cut_fraction"] == out["rows"][1]["edge_cut_fraction"]  # one budget choice: same METIS


@pytest.mark.slow
def test_bench_verify_writes_its_record(tmp_path):
    out = _run("bench_verify", tmp_path, "--nodes", "3000", "--repeats", "1")
    assert len(out["rows"]) == 5 and all(r["seconds"] > 0 for r in out["rows"])


@pytest.mark.slow
def test_bench_data_wait_reports_each_way_and_the_same_losses_on_cpu(tmp_path):
    out = _run("bench_data_wait", tmp_path, "--device", "cpu", "--epochs", "2", "--repeats", "1",
               "--spec", "synthetic:nodes=1500,avg_degree=5,features=8,classes=3,seed=0", "--data", str(tmp_path / "d"),
               "--way", "threads=", "--way", "p1=--loader-workers 1", "--flag=--hidden", "--flag=16")
    assert out["ways"] == {"threads": "", "p1": "--loader-workers 1"} and out["same_losses"] is True
    assert all(0 <= share <= 1 for share in out["median_data_wait_share"].values())
    assert [len(r["train_seconds"]) for rs in out["runs"].values() for r in rs] == [1, 1]  # epoch 1 not counted


@pytest.mark.slow
def test_bench_launch_compares_forked_and_fresh_ranks(tmp_path):
    out = _run("bench_launch", tmp_path, "--dataset", str(tmp_path / "ds"), "--spec", TINY, "--ranks", "1",
               "--repeats", "1", "--loader-workers", "1")  # one sampler process a rank: forked, then spawned
    [record] = (tmp_path / "records" / "bench_launch").glob("*.json")
    assert json.loads(record.read_text())["config"]["loader_workers"] == 1
    rows = {r["mode"]: r for r in out["rows"]}
    assert set(rows) == {"forked", "fresh"} and all("failed" not in r for r in rows.values()), out["rows"]
    assert rows["forked"]["cpu_vs_fresh"] == round(rows["forked"]["cpu_seconds"] / rows["fresh"]["cpu_seconds"], 3)
    assert all(r["first_epoch_seconds"] <= r["wall_seconds"] and r["cpu_seconds"] > 0 for r in rows.values())


def test_bench_cache_policy_replays_every_policy_at_every_capacity(tmp_path):
    out = _run("bench_cache_policy", tmp_path, "--spec", TINY, "--data", str(tmp_path / "c"), "--fanout", "5,3",
               "--batch-size", "64", "--capacities", "100,4000", "--seed", "1")
    small, whole = out["rows"]
    assert set(small["hit_share"]) == {"static", "sieve", "static+sieve", "s3fifo", "static+s3fifo", "first_pass"}
    assert all(0 < v < 1 for v in small["hit_share"].values()), small
    assert whole["capacity_rows"] == out["num_rows"] == 4000
    for policy in small["hit_share"]:  # a larger cache never hits less
        assert whole["hit_share"][policy] >= small["hit_share"][policy], policy
    assert whole["hit_share"]["sieve"] > 0.95, whole  # room for every row: only rows new in the last pass miss


def test_s3fifo_keeps_rows_read_again_through_a_scan_of_rows_read_once():
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_cache_policy

    hot, scan = np.arange(10), np.arange(100, 10_100)  # 10 rows read every round, 10,000 read once
    trace = np.concatenate([np.concatenate([hot, scan[i:i + 50]]) for i in range(0, len(scan), 50)])
    none = np.zeros(10_100, np.bool_)
    for promote in (1, 2):
        hits = bench_cache_policy.replay_s3fifo(trace, none, 100, 0, promote)
        assert hits >= 10 * 200 - 10 * (promote + 1), (promote, hits)  # hot rows miss only until promoted
        assert hits <= 10 * 200  # rows read once never hit
    fixed = none.copy()
    fixed[:10] = True  # held outside the queues: every read of them hits, none enters a queue
    assert bench_cache_policy.replay_s3fifo(trace, fixed, 100, 0, 1) == 10 * 200
    assert bench_cache_policy.replay_s3fifo(trace, none, 0, 0, 1) == 0


def test_bench_disk_reads_reads_a_loaders_rows_with_each_engine(tmp_path):
    from graphstore.storage import uring
    from tests.graphstore.test_directrows import _on_tmpfs

    if _on_tmpfs(tmp_path) or uring.open_ring(8, 1 << 16) is None:
        pytest.skip("direct I/O needs a disk (not tmpfs), the ring an io_uring")
    out = _run("bench_disk_reads", tmp_path, "--spec", TINY, "--data", str(tmp_path / "d"), "--fanout", "5,3",
               "--batch-size", "64", "--batches", "1", "--repeats", "1", "--engines", "threads:4,uring:8,faults,ahead",
               "--seed", "1")
    threads, ring, faults, ahead = out["rows"]
    assert [r["engine"] for r in out["rows"]] == ["threads:4", "uring:8", "faults", "ahead"]
    assert threads["ratio_to_first"] == 1.0 and min(r["rows_per_batch"] for r in out["rows"]) > 64  # seeds and more
    assert threads["mb_per_s"] > 0 and ring["mb_per_s"] > 0 and ring["cpu_us_per_row"] > 0
    assert faults["rows_per_s"] > 0 and ahead["rows_per_s"] > 0  # evicted, then faulted in (or read ahead)


def test_bench_beyond_ram_times_the_first_and_steady_epochs_of_a_job_in_the_cgroup(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import memcgroup

    if memcgroup.available() is not None:
        pytest.skip(str(memcgroup.available()))
    out = _run("bench_beyond_ram", tmp_path, "--spec", TINY, "--dataset", str(tmp_path / "b"), "--limit", "3GB",
               "--cases", "unmapped-cache,session", "--feature-cache", "64KB", "--fanout", "5,3", "--batch-size", "256",
               "--epochs", "2", "--seed", "1", "--nproc", "2")
    assert (tmp_path / "b" / "parts2").is_dir()  # ingested in a partition per rank
    unmapped, session = out["rows"]  # two jobs, each the launcher and its 2 ranks in the cgroup, two epochs timed
    assert unmapped["case"] == "cgroup, --unmapped --feature-cache 64KB"
    assert unmapped["first_over_steady"] == round(unmapped["train_seconds"] / unmapped["steady_seconds"], 3) > 0
    assert unmapped["oom_kills"] == 0 and unmapped["cache_hits"] > 0 and unmapped["loss"] > 0
    assert 0.1 < unmapped["anon_peak_gb"] <= 3  # torch in three processes, within the limit; page cache aside
    assert isinstance(unmapped["major_faults"], int) and unmapped["major_faults"] >= 0
    assert "ratio_to_mapped" not in unmapped and "ratio_to_page_cache" not in unmapped  # nothing to compare with
    # a loop of one's own (training.Session under graphstore-run), the same batches: as many steps, its own figures
    assert session["case"] == "session, cgroup, no flag" and session["steps"] == unmapped["steps"]
    assert session["oom_kills"] == 0 and session["loss"] > 0 and session["steady_seconds"] > 0
    assert session["disk_gb"] == 0.0  # x fits in the limit: no disk tier, feature_stats() counts nothing


def test_bench_variants_worst_keeps_each_lowest_ratio_whichever_row_it_came_from():
    from tests.tools.conftest import load_tool

    worst = load_tool("bench_variants").worst
    rows = [dict(variant="masked", shape="a", edges_per_s=3.0, ratio_to_plain=0.9, ratio_to_eligible_plain=0.6),
            dict(variant="masked", shape="b", edges_per_s=2.0, ratio_to_plain=0.7, ratio_to_eligible_plain=0.8),
            dict(variant="plain", shape="a", edges_per_s=4.0, ratio_to_plain=1.0)]
    assert worst(rows) == {"masked": {"shape": "b", "ratio_to_plain": 0.7, "edges_per_s": 2.0,
                                      "ratio_to_eligible_plain": 0.6, "ratio_to_eligible_plain_shape": "a"}}


def test_the_ranks_of_a_launcher_are_its_children_running_a_rank(monkeypatch):
    """Not the fork server, nor a rank's lifetime guard (a shell the launcher adopts once its rank has ended,
    which bench_train's polling once counted as a third rank)."""
    import psutil

    from tests.tools.conftest import load_tool

    benchinfo = load_tool("benchinfo")
    py = ["/venv/bin/python", "-m"]
    cmdlines = [py + ["training.launcher.forkserver", "--"], py + ["training.launch", "--rank-from-env"],
                ["sh", "-c", "trap '' PIPE ...", "guard", "12", "34"], py + ["training.launch", "--rank-from-env"]]

    class Child:
        def __init__(self, cmd):
            self.cmd = cmd

        def cmdline(self):
            return self.cmd

    class Launcher:
        def __init__(self, pid):
            pass

        def children(self):
            return [Child(c) for c in cmdlines]

    monkeypatch.setattr(psutil, "Process", Launcher)
    assert [c.cmdline() for c in benchinfo.rank_processes(1)] == [cmdlines[1], cmdlines[3]]
