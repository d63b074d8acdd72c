"""Datasets on object storage or any other fsspec file system: backend registry, options, RemoteLocation."""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from graphstore.dataset import layout
from graphstore.errors import (ConfigError, GraphstoreError, MissingBackendError, StorageError, StorageNotFoundError,
                               StoragePermissionError, UnsupportedLocationError)
from graphstore.storage.retry import RetryPolicy, call_with_retry, causes, error_code, is_transient
from graphstore.storage.location import Location, OnRetry, redact_url

logger = logging.getLogger(__name__)
T = TypeVar("T")

# URL scheme -> (package, how to install it); other schemes fall back to fsspec's own registry hints
BACKENDS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("s3", "s3a"), ("s3fs", "pip install 'graphstore[s3]'  (or: pip install s3fs)")),
    **dict.fromkeys(("gs", "gcs"), ("gcsfs", "pip install 'graphstore[gcs]'  (or: pip install gcsfs)")),
    **dict.fromkeys(("az", "abfs", "abfss"), ("adlfs", "pip install 'graphstore[azure]'  (or: pip install adlfs)")),
}
_OBJECT_STORES = frozenset(BACKENDS)  # schemes whose first path component is a bucket / container
_FSSPEC_COMMON = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths"})  # every fsspec fs
_OURS = frozenset({"skip_instance_cache", "asynchronous", "loop"})  # graphstore sets these itself
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY",
               "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
               "AZURE_CLIENT_SECRET", "GOOGLE_OAUTH_ACCESS_TOKEN")
_DENIED_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                           "InvalidToken", "AllAccessDisabled", "AccountProblem", "403", "401"})
# what bounded() changes per backend: (botocore config_kwargs, attributes of the file system)
_BOUNDED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = dict.fromkeys(
    ("s3", "s3a"), ({"connect_timeout": 2, "retries": {"total_max_attempts": 1}}, {"retries": 1}))
_CREDENTIAL_HINT = ("check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
                    "GOOGLE_APPLICATION_CREDENTIALS, or storage_options) and the bucket's access policy")


def filesystem_class(protocol: str, url: str) -> type:
    """The fsspec file system class serving ``protocol``; ImportError with the pip command if not installed."""
    import fsspec

    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError:
        package, hint = BACKENDS.get(protocol, ("", ""))
        if not hint:
            hint = fsspec.registry.known_implementations.get(protocol, {}).get("err", "install its fsspec backend")
        raise MissingBackendError(f"cannot open {url}: {protocol}:// URLs need the optional package "
                                  f"{package or 'that implements them'}, which is not installed; {hint}") from None
    except ValueError:
        raise UnsupportedLocationError(
            f"cannot open {url}: {protocol!r} is not a URL scheme fsspec knows; use a local path, file://, "
            "s3://, gs://, az:// or another fsspec protocol"
        ) from None


def check_options(cls: type, options: dict[str, Any], url: str) -> None:
    """Refuse storage options that ``cls`` would silently ignore (typos) or that graphstore sets itself."""
    ours = sorted(set(options) & _OURS)
    if ours:
        raise UnsupportedLocationError(f"storage option(s) {ours} for {url} are set by graphstore itself; remove them")
    accepted = set(_FSSPEC_COMMON)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        accepted.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise UnsupportedLocationError(
            f"storage option(s) {unknown} are not accepted by {cls.__name__} (for {url}) and would be ignored; "
            f"fix the name. Accepted: {sorted(accepted - _OURS - {'self'})}"
        )


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


class RemoteLocation(Location):
    """A dataset under any fsspec URL (``s3://bucket/path``, ``gs://...``, ``az://...``, ``memory://...``).

    Every operation retries transient errors under ``retry`` and turns the rest into graphstore
    errors naming the URL (never credentials). The fsspec file system is created lazily, per process,
    with ``skip_instance_cache=True``, and dropped when pickled.

    The storage option ``offline`` is graphstore's own (never passed to fsspec): ``True`` means the store
    is never contacted (the dataset is served from the local cache, see :mod:`graphstore.storage.offline`),
    ``False`` that an unreachable store is an error even when the cache could serve, and absent (``None``)
    that an unreachable store falls back to the cache.

    Examples
    --------
    >>> loc = RemoteLocation("s3://bucket/cora", {"anon": True})  # doctest: +SKIP
    >>> loc.read_json("zarr.json")["zarr_format"]  # doctest: +SKIP
    3
    """

    is_local = False

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy | None = None) -> None:
        self.url = redact_url(url)
        self.protocol = url.split("://", 1)[0]
        if "::" in self.protocol:
            raise UnsupportedLocationError(f"chained URL {self.url!r}: graphstore caches chunks itself; give the "
                                           "plain URL (without simplecache:: and the like)")
        self._raw_url = url
        self.storage_options = dict(storage_options or {})
        self.offline = _offline_option(self.storage_options.pop("offline", None), self.url)
        self.retry = retry or RetryPolicy()
        cls = filesystem_class(self.protocol, self.url)
        check_options(cls, self.storage_options, self.url)
        self.root = cls._strip_protocol(url).rstrip("/")
        self._url_options = cls._get_kwargs_from_urls(url)  # host, user, ... of ssh-like URLs (never shown)
        self._fs: Any = None
        self._pid = 0
        self._bounded = False  # see bounded()

    def __repr__(self) -> str:
        return f"RemoteLocation({self.url!r}, storage_options={sorted(self.storage_options)})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"], state["_pid"] = None, 0  # clients never cross processes; reopened lazily
        return state

    @property
    def fs(self) -> Any:
        """This process's fsspec file system (created on first use, again after a fork)."""
        if self.offline:
            raise StorageError(f"{self.url} is served from the local cache (offline): graphstore sends its store no "
                               "request, and this needs the store (verify, ingest, writing outputs); reconnect to "
                               "it and open the dataset again, without the storage option offline=true")
        if self._fs is None or self._pid != os.getpid():
            cls = filesystem_class(self.protocol, self.url)
            self._fs, self._pid = cls(skip_instance_cache=True, **self._options()), os.getpid()
            if self._bounded:
                for name, value in _BOUNDED.get(self.protocol, ({}, {}))[1].items():
                    setattr(self._fs, name, value)
        return self._fs

    def _options(self) -> dict[str, Any]:
        options = {**self._url_options, **self.storage_options}
        if self.protocol in ("s3", "s3a"):  # enough connections for the cache's concurrent fetches
            config = dict(options.get("config_kwargs") or {})
            config.setdefault("max_pool_connections", 32)
            options["config_kwargs"] = config
        if self._bounded and self.protocol in _BOUNDED:
            config = dict(options.get("config_kwargs") or {})
            for name, value in copy.deepcopy(_BOUNDED[self.protocol][0]).items():
                config[name] = min(config.get(name, value), value) if name == "connect_timeout" else value
            options["config_kwargs"] = config
        return options

    def bounded(self) -> RemoteLocation:
        """A copy whose requests give up within seconds when the store cannot be reached: one attempt, and
        (S3) no retries inside s3fs or botocore and a connect timeout of 2 s at most. Used to tell, before
        serving a dataset from the cache, whether its store can be reached at all."""
        probe = copy.copy(self)
        probe._fs, probe._pid, probe._bounded = None, 0, True
        probe.retry = RetryPolicy(attempts=1)
        return probe

    def offline_copy(self) -> RemoteLocation:
        """A copy that never contacts the store: its dataset is served from the local cache (and stays so
        when pickled to other processes)."""
        served = copy.copy(self)
        served._fs, served._pid, served.offline = None, 0, True
        return served

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _call(self, action: str, fn: Callable[..., T], *args: Any, on_retry: OnRetry | None = None,
              policy: RetryPolicy | None = None) -> T:
        """``fn(*args)`` with retries; a missing key stays FileNotFoundError, the rest become graphstore errors."""
        try:
            return call_with_retry(fn, *args, policy=policy or self.retry, what=f"{action} ({self.url})",
                                   on_retry=on_retry)
        except FileNotFoundError as exc:
            if _bucket_missing(exc):
                raise self.storage_error(exc, action, (policy or self.retry).attempts) from exc
            raise
        except GraphstoreError:
            raise
        except Exception as exc:
            raise self.storage_error(exc, action, (policy or self.retry).attempts) from exc

    def read_bytes(self, key: str) -> bytes | None:
        try:
            return self._call(f"reading {key}", self.fs.cat_file, self._path(key))
        except FileNotFoundError as exc:
            return _absent(exc)

    def download(self, key: str, dest: str, on_retry: OnRetry | None = None) -> int | None:
        try:
            self._call(f"downloading {key}", self.fs.get_file, self._path(key), dest, on_retry=on_retry)
        except FileNotFoundError as exc:
            return _absent(exc)
        return os.path.getsize(dest)

    def exists(self) -> bool:
        return self.has("")

    def is_empty(self) -> bool:
        try:
            return not self._call("listing", self._listing, self.root)
        except FileNotFoundError as exc:
            return _absent(exc) is None

    def has(self, key: str) -> bool:
        self.fs.invalidate_cache()
        try:
            return bool(self._call(f"looking up {key or 'the root'}", self.fs.exists, self._path(key)))
        except FileNotFoundError as exc:
            return _absent(exc) is not None

    def keys(self) -> list[str] | None:
        self.fs.invalidate_cache()
        try:
            found = self._call("listing", self.fs.find, self.root)
        except FileNotFoundError:
            return []
        prefix = self.root.rstrip("/") + "/"
        return sorted(k[len(prefix):] for k in found if k.startswith(prefix))

    def _listing(self, path: str) -> list[str]:
        self.fs.invalidate_cache()
        return self.fs.ls(path, detail=False)

    def zarr_store(self, read_only: bool = True) -> Any:
        """A zarr ``FsspecStore`` over this process's (synchronous) file system, wrapped for zarr's event
        loop: one client and one connection pool per process, whatever zarr's loop does."""
        from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
        from zarr.storage import FsspecStore

        return FsspecStore(AsyncFileSystemWrapper(self.fs, asynchronous=True), read_only=read_only, path=self.root)

    def remove_key(self, key: str) -> None:
        try:
            self._call(f"deleting {key}", self.fs.rm_file, self._path(key))
        except FileNotFoundError as exc:
            _absent(exc)

    def remove(self) -> None:
        try:
            self._call("deleting the dataset", self.fs.rm, self.root, True)
        except FileNotFoundError as exc:
            _absent(exc)
        self.fs.invalidate_cache()

    def claim_slot(self) -> ObjectSlot:
        """Where an ingest into this prefix keeps its claim: an object beside it (see graphstore.ingest.claim)."""
        parent, _, name = self.root.rpartition("/")
        if self.protocol in _OBJECT_STORES and not parent:
            raise UnsupportedLocationError(f"DEST {self.url} is a whole bucket: give a prefix inside it, e.g. "
                                           f"{self.url.rstrip('/')}/name (ingest keeps its claim beside the dataset)")
        return ObjectSlot(self, f"{parent}/{layout.ingest_claim(name)}")

    def check_container(self) -> None:
        bucket = self.root.split("/", 1)[0]
        if self.protocol not in _OBJECT_STORES or not bucket:
            return
        try:  # the first contact: the backend's own retries are enough to tell a dead endpoint from a blip
            self._call(f"looking up bucket {bucket}", self.fs.info, bucket, policy=RetryPolicy(attempts=1))
        except FileNotFoundError as exc:
            if isinstance(exc, GraphstoreError):
                raise
            raise StorageNotFoundError(
                f"the bucket {bucket!r} of {self.url} does not exist (or these credentials cannot see it): create "
                "it first (graphstore never creates buckets), or fix the URL"
            ) from exc

    def storage_error(self, exc: BaseException, action: str, attempts: int | None = None) -> BaseException:
        if isinstance(exc, GraphstoreError):
            return exc
        detail = self._scrub(f"{type(exc).__name__}: {exc}")[:400]
        codes = {error_code(err)[0] for err in causes(exc)}
        names = {t.__name__ for err in causes(exc) for t in type(err).__mro__}
        if _bucket_missing(exc):
            return StorageNotFoundError(f"{action}: the bucket of {self.url} does not exist (or these credentials "
                                        f"cannot see it) ({detail}); fix the URL or create the bucket")
        if isinstance(exc, PermissionError) or codes & _DENIED_CODES or "NoCredentialsError" in names:
            return StoragePermissionError(f"{action}: access to {self.url} was denied ({detail}); {_CREDENTIAL_HINT}")
        if isinstance(exc, FileNotFoundError):
            return StorageNotFoundError(f"{action}: not found under {self.url} ({detail})")
        attempts = attempts or self.retry.attempts
        tried = f" after {attempts} attempts" if is_transient(exc) and attempts > 1 else ""
        return StorageError(f"{action}: {self.url} failed{tried} ({detail}); check the endpoint and network, "
                            "or raise the retry limits")

    def _scrub(self, text: str) -> str:
        """``text`` without any credential graphstore knows of (storage option values, secret env vars)."""
        options = {**self._url_options, **self.storage_options}
        secrets = [s for s in _strings(options) if len(s) >= 4 and "://" not in s]
        secrets += [os.environ[name] for name in _SECRET_ENV if len(os.environ.get(name, "")) >= 4]
        userinfo = self._raw_url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
        secrets += [userinfo] if userinfo else []
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return redact_url(text)


class ObjectSlot:
    """An ingest claim as an object beside the dataset, created only if absent (S3: ``If-None-Match: *``).

    A backend without a conditional create (fsspec's generic ``mode="create"`` looks, then writes) can
    let two creators both succeed; the claim protocol reads the claim back after creating it and again
    before it commits (graphstore.ingest.claim), so at most one of them commits.
    """

    def __init__(self, location: RemoteLocation, path: str) -> None:
        self.location, self.path = location, path
        self.where = redact_url(f"{location.protocol}://{path.lstrip('/')}")

    def create(self, data: bytes) -> bool:
        """Create the claim holding ``data``; ``False`` if there is one already (a retried create that
        had succeeded also says ``False``: the caller reads the claim and finds its own token)."""
        return self.location._call(f"creating the ingest claim {self.where}", self._create, data)

    def _create(self, data: bytes) -> bool:
        fs = self.location.fs
        try:
            fs.pipe_file(self.path, data, mode="create")
        except FileExistsError:
            return False
        except TypeError:  # a backend whose pipe_file predates mode=: look, then write (the race above)
            if fs.exists(self.path):
                return False
            fs.pipe_file(self.path, data)
        return True

    def read(self) -> bytes | None:
        self.location.fs.invalidate_cache()
        try:
            return self.location._call(f"reading the ingest claim {self.where}", self.location.fs.cat_file, self.path)
        except FileNotFoundError as exc:
            return _absent(exc)

    def remove(self) -> None:
        try:
            self.location._call(f"deleting the ingest claim {self.where}", self.location.fs.rm_file, self.path)
        except FileNotFoundError as exc:
            _absent(exc)
        self.location.fs.invalidate_cache()

    def set_aside(self, stale: bytes) -> None:
        """Delete the claim if it still holds ``stale``. Object stores have no rename: another process can
        take the claim between the read and the delete, and lose it; it then fails at its commit."""
        if self.read() == stale:
            self.remove()


def _absent(exc: FileNotFoundError) -> None:
    """``None`` for a missing key; a graphstore error (a missing bucket, say) is raised instead."""
    if isinstance(exc, GraphstoreError):
        raise exc
    return None


def _offline_option(value: Any, url: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigError(f"storage option offline={value!r} for {url} is invalid: give true (never contact the store), "
                      "false (never fall back to the cache) or leave it out (fall back when the store is unreachable)")


def _bucket_missing(exc: BaseException) -> bool:
    for err in causes(exc):
        if error_code(err)[0] in ("NoSuchBucket", "NoSuchContainer", "ContainerNotFound"):
            return True
        if "bucket does not exist" in str(err).lower():
            return True
    return False
