"""Retry transient storage errors (timeouts, 5xx, throttling, dropped connections) with exponential backoff."""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from graphstore.errors import ConfigError

logger = logging.getLogger(__name__)
T = TypeVar("T")

# exception class names (anywhere in the MRO) of errors worth another try: builtin, botocore, aiohttp, fsspec
_TRANSIENT_TYPES = frozenset({
    "TimeoutError", "ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError",
    "IncompleteRead", "FSTimeoutError", "ResponseStreamingError", "ProxyConnectionError",
})
_TRANSIENT_CODES = frozenset({
    "RequestTimeout", "RequestTimeoutException", "Throttling", "ThrottlingException", "ThrottledException",
    "SlowDown", "TooManyRequests", "TooManyRequestsException", "RequestLimitExceeded", "InternalError",
    "ServiceUnavailable", "BandwidthLimitExceeded", "OperationAborted",
})
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_ERRNO = frozenset({errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET,
                              getattr(errno, "EREMOTEIO", errno.EIO)})  # s3fs maps 5xx/SlowDown to these
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
# errors that mean no connection to the store could be made at all (refused, no route, DNS, connect timeout):
# botocore, aiohttp (gcsfs, adlfs), azure-core and the builtins. A store that answered, even with an error, is not here.
_UNREACHABLE_TYPES = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", "ClientConnectorError",
    "ConnectionTimeoutError", "ServiceRequestError", "ConnectionRefusedError", "gaierror", "NewConnectionError",
})
_UNREACHABLE_ERRNO = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN,
                                errno.ENETDOWN})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient storage error.

    ``attempts`` counts every try (1 = never retry); the n-th retry waits about
    ``min(max_delay, base_delay * 2**n)`` seconds, with jitter.

    Examples
    --------
    >>> RetryPolicy(attempts=3).delay(0) <= 0.2
    True
    """

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigError(f"retry attempts {self.attempts!r} is invalid: give an integer >= 1 (1 = no retries)")
        if not 0 <= self.base_delay <= self.max_delay:
            raise ConfigError(f"retry delays base {self.base_delay!r} / max {self.max_delay!r} are invalid: "
                              "need 0 <= base_delay <= max_delay")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        return min(self.max_delay, self.base_delay * 2**retry) * (0.5 + random.random() / 2)


def error_code(exc: BaseException) -> tuple[str | None, int | None]:
    """The service's error code and HTTP status of ``exc`` (botocore, gcsfs style), where it carries them."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return (str(code) if code is not None else None), status
    status = getattr(exc, "code", None) or getattr(exc, "status", None)
    return None, status if isinstance(status, int) else None


def causes(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and its chain of ``__cause__`` (explicit ``raise ... from``)."""
    out: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in out):
        out.append(exc)
        exc = exc.__cause__
    return out


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a timeout, a dropped connection, throttling or a 5xx."""
    for err in causes(exc):
        if isinstance(err, _PERMANENT):
            return False
        if _TRANSIENT_TYPES.intersection(t.__name__ for t in type(err).__mro__):
            return True
        code, status = error_code(err)
        if code in _TRANSIENT_CODES or (code or "").isdigit() and int(code or 0) in _TRANSIENT_STATUS:
            return True
        if status in _TRANSIENT_STATUS or isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNO:
            return True
    return False


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store could not be connected to at all: connection refused,
    no route or name, a connect timeout. Access denied, a missing bucket or a 5xx are answers, so never this."""
    for err in causes(exc):
        if _UNREACHABLE_TYPES.intersection(t.__name__ for t in type(err).__mro__):
            return True
        if isinstance(err, OSError) and err.errno in _UNREACHABLE_ERRNO:
            return True
    return False


def call_with_retry(fn: Callable[..., T], *args: Any, policy: RetryPolicy, what: str,
                    on_retry: Callable[[BaseException], None] | None = None,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn(*args)``, retried on transient errors as ``policy`` says; permanent errors raise at once.

    ``what`` names the operation in log lines and must hold no credentials.
    """
    for retry in range(policy.attempts):
        try:
            return fn(*args)
        except Exception as exc:
            if retry + 1 >= policy.attempts or not is_transient(exc):
                raise
            delay = policy.delay(retry)
            logger.warning("%s failed (%s); retry %d of %d in %.2f s", what, type(exc).__name__, retry + 1,
                           policy.attempts - 1, delay)
            if on_retry is not None:
                on_retry(exc)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover  (the loop returns or raises)
