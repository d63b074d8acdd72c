"""What ``graphstore-run --servers/--loader-workers`` hand a script's ``training.Session`` (its defaults), and the
one line a bad value gets, before any rank starts."""

from __future__ import annotations

import pytest

from graphstore.errors import InvalidInputError
from training import run
from training.cluster.world import FEATURE_CACHE_ENV, LOADER_WORKERS_ENV, SERVERS_ENV
from training.loop.session import Session


def test_the_servers_of_the_environment_are_the_sessions_default_and_an_argument_wins(monkeypatch):
    monkeypatch.setenv(SERVERS_ENV, "10.0.0.1:29600")
    assert Session("graphs/any").served_by == "10.0.0.1:29600"
    assert Session("graphs/any", servers="10.0.0.2:29601").served_by == "10.0.0.2:29601"
    monkeypatch.delenv(SERVERS_ENV)
    assert Session("graphs/any").served_by is None


def test_loader_workers_from_the_environment_are_checked_and_refused_beside_servers(monkeypatch):
    monkeypatch.setenv(LOADER_WORKERS_ENV, "two")
    with pytest.raises(InvalidInputError, match=r"\$GRAPHSTORE_LOADER_WORKERS='two': give a count"):
        Session("graphs/any")
    monkeypatch.setenv(LOADER_WORKERS_ENV, "2")
    monkeypatch.setenv(SERVERS_ENV, "10.0.0.1:29600")
    with pytest.raises(InvalidInputError, match="with servers: the sampler servers build the batches"):
        Session("graphs/any")
    assert Session("graphs/any", loader_workers=0).loader_workers == 0  # an argument wins


def test_the_feature_cache_of_the_environment_is_the_sessions_default_checked_in_one_line(monkeypatch):
    monkeypatch.setenv(FEATURE_CACHE_ENV, "512MB")
    assert Session("graphs/any").feature_cache == 512_000_000
    assert Session("graphs/any", feature_cache="off").feature_cache == "off"  # an argument wins
    assert Session("graphs/any", feature_cache=0).feature_cache == 0
    monkeypatch.delenv(FEATURE_CACHE_ENV)
    assert Session("graphs/any").feature_cache is None  # by itself, when x exceeds half of the memory
    for bad in ("lots", -1, True):
        with pytest.raises(InvalidInputError, match=r"Session\(feature_cache=...\) .*: give a size"):
            Session("graphs/any", feature_cache=bad)
    with pytest.raises(InvalidInputError, match="with servers: the sampler servers read the features"):
        Session("graphs/any", feature_cache="1GB", servers="10.0.0.1:29600")


def test_a_short_ranks_room_is_counted_from_the_seeds_and_neighbours_a_batch_may_draw():
    from training.loop.session_features import fanout_bound, seeds_per_example

    assert seeds_per_example("loader", {}) == 1
    assert seeds_per_example("link_loader", {}) == 2  # the link's two ends
    assert seeds_per_example("link_loader", {"neg_sampling": "binary"}) == 4  # and a negative link's
    assert seeds_per_example("link_loader", {"neg_sampling": {"mode": "triplet", "amount": 5}}) == 7
    assert seeds_per_example("link_loader", {"neg_sampling_ratio": 2.5}) == 2 + 2 * 3
    from torch_geometric.sampler import NumNeighbors

    assert fanout_bound([10, 5]) == (10, 5) and fanout_bound(NumNeighbors([4, 2])) == (4, 2)
    assert fanout_bound({("a", "to", "b"): [10, 5], ("b", "to", "a"): [3, -1], ("a", "self", "a"): [2]}) == (15, -1)


@pytest.mark.parametrize("args, words", [
    (["--servers", "nowhere"], "--servers 'nowhere': give HOST:PORT"),
    (["--servers", "127.0.0.1:29600", "--loader-workers", "1"], "--loader-workers 1 with --servers"),
    (["--servers", "127.0.0.1:29600", "--feature-cache", "1GB"], "--feature-cache 1GB with --servers"),
    (["--feature-cache", "lots"], "argument --feature-cache: 'lots' is not a size"),
])
def test_graphstore_run_refuses_bad_server_flags_in_one_line(tmp_path, capsys, args, words):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a rank started')\n")
    assert run.main([*args, str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphstore-run: error: ") and words in err and "\n" not in err, err


def _agreeing(monkeypatch, timeout: float):
    """Rank 0 of two, joined, whose rendezvous store is an in-process one (the peer's keys set by hand)."""
    import torch.distributed as dist

    from training.cluster.world import World

    store = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    session = Session("graphs/any", timeout=timeout, world=World(0, 2, 0, "file:///unused"))
    session.world, session._started = session._world, True
    return session, store


def test_loaders_agree_on_the_most_steps_and_name_a_peer_that_left_or_never_came(monkeypatch):
    from graphstore.errors import GraphstoreError

    session, store = _agreeing(monkeypatch, timeout=60)
    store.set("graphstore/session/loader/0/1", "7")
    assert session._agree_steps(0, 5) == 7
    store.set(Session._LEFT + "1", "1")  # rank 1 left after creating one loader: loader 1 never comes
    store.add(Session._LEFT_COUNT, 1)
    with pytest.raises(GraphstoreError, match="rank 1 did not create loader 1 before it left the session"):
        session._agree_steps(1, 5)  # at once, not after the 60 s
    session, store = _agreeing(monkeypatch, timeout=0.3)
    with pytest.raises(GraphstoreError, match=r"rank 1 did not create loader 0 within 0 s \(timeout\)"):
        session._agree_steps(0, 5)  # still in the job: named when the timeout ends
