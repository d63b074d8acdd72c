"""S3 fixtures: a local moto server (never the network), fake credentials, a fresh bucket per test."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import pytest

# fake credentials, distinctive so tests can check no message ever shows them
ACCESS_KEY = "AKIAGRAPHSTORETESTKEY"
SECRET_KEY = "graphstore-test-secret-9f3c1e"


@pytest.fixture(autouse=True)
def _cache_in_tmp(monkeypatch, tmp_path_factory) -> None:
    """Datasets opened without ``cache_dir`` cache under the test's temporary directory, never in ~/.cache."""
    monkeypatch.setenv("GRAPHSTORE_CACHE_DIR", str(tmp_path_factory.mktemp("graphstore-cache")))
    monkeypatch.delenv("GRAPHSTORE_CACHE_MAX_BYTES", raising=False)


@dataclass
class S3:
    """One test's S3: the moto endpoint, its bucket, and the storage options that reach it."""

    endpoint: str
    bucket: str
    storage_options: dict = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def cli_options(self) -> list[str]:
        return ["--storage-option", f"client_kwargs.endpoint_url={self.endpoint}"]


def start_moto():
    """A moto S3 server on a free local port, and its ``http://127.0.0.1:<port>`` endpoint."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


@pytest.fixture(scope="session")
def moto_endpoint():
    server, endpoint = start_moto()
    yield endpoint
    server.stop()


def fake_credentials(monkeypatch, tmp_path) -> None:
    """Fake AWS credentials in the environment; no config files, no metadata service, no proxies."""
    for name, value in {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
                        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)


def new_bucket(endpoint: str) -> S3:
    s3 = S3(endpoint, f"gs-{uuid.uuid4().hex[:12]}", {"client_kwargs": {"endpoint_url": endpoint}})
    s3.fs().mkdir(s3.bucket)
    return s3


@pytest.fixture
def s3(moto_endpoint, monkeypatch, tmp_path) -> S3:
    """A fresh bucket on the session's moto server, with fake credentials in the environment."""
    fake_credentials(monkeypatch, tmp_path)
    return new_bucket(moto_endpoint)
