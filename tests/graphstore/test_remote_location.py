"""Turning URLs into locations: schemes, backends, storage options, credentials in messages, retries."""

from __future__ import annotations

import errno
import pickle

import pytest

from graphstore.cli.storage_options import parse_storage_options
from graphstore.errors import (ConfigError, MissingBackendError, StorageError, StoragePermissionError,
                               UnsupportedLocationError)
from graphstore.storage.remote import RemoteLocation
from graphstore.storage.retry import RetryPolicy, call_with_retry, is_transient
from graphstore.storage.local import LocalLocation, open_location, redact_url

pytest.importorskip("s3fs")
FAST = RetryPolicy(attempts=3, base_delay=0.0, max_delay=0.0)


def test_local_paths_and_file_urls_are_local(tmp_path):
    assert isinstance(open_location(tmp_path / "d"), LocalLocation)
    assert open_location(f"file://{tmp_path}/d").root == f"{tmp_path}/d"
    with pytest.raises(UnsupportedLocationError, match=r"storage_options \['anon'\] do nothing"):
        open_location(tmp_path, {"anon": True})
    with pytest.raises(UnsupportedLocationError, match="retry"):
        open_location(tmp_path, retry=FAST)
    loc = open_location(tmp_path)
    assert open_location(loc) is loc


def test_remote_urls_check_their_options():
    loc = open_location("s3://bucket/ds", {"anon": True, "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}})
    assert isinstance(loc, RemoteLocation) and loc.url == "s3://bucket/ds" and loc.root == "bucket/ds"
    with pytest.raises(UnsupportedLocationError, match=r"\['endpoint_ur'\] are not accepted by S3FileSystem"):
        open_location("s3://bucket/ds", {"endpoint_ur": "http://x"})  # a typo would be silently ignored
    with pytest.raises(UnsupportedLocationError, match="set by graphstore itself"):
        open_location("s3://bucket/ds", {"skip_instance_cache": False})
    with pytest.raises(UnsupportedLocationError, match="not a URL scheme fsspec knows"):
        open_location("nosuchscheme://x/y")
    with pytest.raises(UnsupportedLocationError, match="chained URL"):
        open_location("simplecache::s3://bucket/ds")


def test_a_missing_backend_names_the_pip_command():
    with pytest.raises(ImportError, match=r"gcsfs.*pip install 'graphstore\[gcs\]'") as err:
        open_location("gs://bucket/ds")  # gcsfs is not a dependency of the test environment
    assert isinstance(err.value, MissingBackendError)


def test_credentials_never_show():
    assert redact_url("s3://AKIA:s3cr3t@bucket/ds") == "s3://bucket/ds"
    assert redact_url("https://host/ds?sig=abc&se=1") == "https://host/ds?<redacted>"
    loc = open_location("s3://bucket/ds", {"key": "AKIAVISIBLE", "secret": "very-secret-value"})
    assert "very-secret-value" not in repr(loc) and "AKIAVISIBLE" not in repr(loc)
    error = loc.storage_error(PermissionError("denied for very-secret-value and AKIAVISIBLE"), "reading zarr.json")
    assert isinstance(error, StoragePermissionError) and "very-secret-value" not in str(error)
    assert "AKIAVISIBLE" not in str(error) and "s3://bucket/ds" in str(error)


def test_locations_pickle_without_clients():
    loc = open_location(f"memory://gs-pickle/ds", retry=FAST)
    loc.fs  # create the client
    again = pickle.loads(pickle.dumps(loc))
    assert again._fs is None and again.url == loc.url and again.retry == FAST
    assert again.fs is not loc.fs  # skip_instance_cache: no hidden sharing


def test_transient_errors_are_told_apart():
    from botocore.exceptions import ClientError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError())
    assert is_transient(client_error("SlowDown", 503)) and is_transient(client_error("InternalError", 500))
    assert is_transient(OSError(errno.EBUSY, "SlowDown"))  # how s3fs translates throttling
    wrapped = OSError(errno.EIO, "translated")
    wrapped.__cause__ = client_error("ServiceUnavailable", 503)
    assert is_transient(wrapped)
    assert not is_transient(client_error("AccessDenied", 403)) and not is_transient(FileNotFoundError("k"))
    assert not is_transient(PermissionError("Forbidden")) and not is_transient(ValueError("bad"))


def test_retries_are_bounded_and_counted():
    calls, retried = [], []

    def flaky(fail: int):
        calls.append(1)
        if len(calls) <= fail:
            raise ConnectionResetError("reset")
        return "ok"

    assert call_with_retry(flaky, 2, policy=FAST, what="test", on_retry=retried.append) == "ok"
    assert len(calls) == 3 and len(retried) == 2
    calls.clear()
    with pytest.raises(ConnectionResetError):
        call_with_retry(flaky, 5, policy=FAST, what="test")
    assert len(calls) == 3  # the bound
    calls.clear()
    with pytest.raises(PermissionError):
        call_with_retry(lambda: calls.append(1) or (_ for _ in ()).throw(PermissionError("no")), policy=FAST,
                        what="test")
    assert len(calls) == 1  # permanent: at once
    with pytest.raises(ConfigError):
        RetryPolicy(attempts=0)


def test_a_remote_location_retries_then_names_the_url(monkeypatch):
    loc = open_location("memory://gs-retry/ds", retry=FAST)
    loc.fs.pipe_file("gs-retry/ds/zarr.json", b"{}")
    real, failures = loc.fs.cat_file, [ConnectionResetError("reset"), TimeoutError("slow")]

    def flaky(path, *args, **kwargs):
        if failures:
            raise failures.pop(0)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loc.fs, "cat_file", flaky)
    assert loc.read_bytes("zarr.json") == b"{}" and not failures
    failures.extend([ConnectionResetError("reset")] * 5)
    with pytest.raises(StorageError, match=r"reading zarr.json: memory://gs-retry/ds failed after 3 attempts"):
        loc.read_bytes("zarr.json")
    assert loc.read_bytes("missing.json") is None
    loc.remove()


def test_storage_options_from_the_command_line():
    opts = parse_storage_options(["anon=false", "client_kwargs.endpoint_url=http://127.0.0.1:9000",
                                  "client_kwargs.region_name=eu-west-1", "config_kwargs.max_pool_connections=64",
                                  "default_block_size=1.5", "s3_additional_kwargs={\"ACL\": \"private\"}",
                                  "token=null", "key=abc=def"])
    assert opts == {"anon": False,
                    "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
                    "config_kwargs": {"max_pool_connections": 64}, "default_block_size": 1.5,
                    "s3_additional_kwargs": {"ACL": "private"}, "token": None, "key": "abc=def"}
    with pytest.raises(ConfigError, match="given twice"):
        parse_storage_options(["secret=hunter2", "secret=hunter3"])
    with pytest.raises(ConfigError) as err:
        parse_storage_options(["anon=1", "anon.x=hunter2"])
    assert "hunter2" not in str(err.value)
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        parse_storage_options(["justakey"])
