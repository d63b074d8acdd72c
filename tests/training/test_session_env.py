"""What ``graphstore-run --servers/--loader-workers`` hand a script's ``training.Session`` (its defaults), and the
one line a bad value gets, before any rank starts."""

from __future__ import annotations

import pytest

from graphstore.errors import InvalidInputError
from training import run
from training.cluster.world import LOADER_WORKERS_ENV, SERVERS_ENV
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


@pytest.mark.parametrize("args, words", [
    (["--servers", "nowhere"], "--servers 'nowhere': give HOST:PORT"),
    (["--servers", "127.0.0.1:29600", "--loader-workers", "1"], "--loader-workers 1 with --servers"),
])
def test_graphstore_run_refuses_bad_server_flags_in_one_line(tmp_path, capsys, args, words):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a rank started')\n")
    assert run.main([*args, str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphstore-run: error: ") and words in err and "\n" not in err, err
