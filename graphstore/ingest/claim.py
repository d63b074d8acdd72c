"""One writer per DEST: the claim an ingest takes beside its destination before it writes anything.

The claim is a small JSON document (host, pid, start time, a random token) created only if absent:
``O_CREAT | O_EXCL`` for a local directory, a conditional put for object storage (the location's
``claim_slot()``). A second ingest finds it and is refused, naming the first. A claim whose process
is certainly dead (this machine, and its pid is gone or reused) is cleared and taken over; one from
another machine cannot be checked and is never taken: the refusal names the file to delete.
The claim is read back after it is created and again right before the commit, so an ingest whose
claim was lost (a backend without a true conditional create, a user deleting it) never commits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from graphstore.errors import GraphstoreError, IngestClaimedError
from graphstore.storage.local import Location, local_error

logger = logging.getLogger(__name__)
_ATTEMPTS = 3  # create; clear a dead ingest's claim and create again; once more if another taker raced
_READ_TRIES = 6  # a local claim is created, then written: for a moment it reads empty
_FIELDS = ("host", "pid", "started", "token", "dest")


class ClaimSlot(Protocol):
    """Where the claim of one DEST lives: ``where`` names it to users."""

    where: str

    def create(self, data: bytes) -> bool: ...

    def read(self) -> bytes | None: ...

    def remove(self) -> None: ...

    def set_aside(self, stale: bytes) -> None: ...


@dataclass(frozen=True)
class Holder:
    """What a claim says: the process holding it, where and since when, and its token."""

    host: str
    pid: int
    started: str
    token: str
    dest: str
    machine: str = ""  # boot ID and PID namespace: where ``pid`` names the same process as here
    pid_start: str = ""  # the process's start time since boot: a reused pid is another process

    @classmethod
    def here(cls, dest: str) -> Holder:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), started, uuid.uuid4().hex, dest, _machine(),
                   _pid_start(os.getpid()))

    @classmethod
    def parse(cls, raw: bytes | None) -> Holder | None:
        """The holder ``raw`` describes; ``None`` if it is no claim graphstore wrote."""
        try:
            doc = json.loads(raw or b"")
            return cls(*(doc[k] for k in _FIELDS), str(doc.get("machine", "")), str(doc.get("pid_start", "")))
        except (ValueError, TypeError, KeyError):
            return None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {self.started}"

    def on_this_machine(self) -> bool:
        return self.host == socket.gethostname() and self.machine == _machine()

    def is_dead(self) -> bool:
        """Whether the holder certainly no longer runs: it ran here and its pid is gone or reused."""
        if not self.on_this_machine():
            return False
        if not _alive(self.pid):
            return True
        return bool(self.pid_start) and _pid_start(self.pid) not in ("", self.pid_start)


@dataclass(frozen=True)
class Claim:
    """The claim this ingest holds on ``dest`` through ``slot``."""

    slot: ClaimSlot
    holder: Holder
    dest: str

    def check(self) -> None:
        """Raise unless the claim is still this ingest's (call it right before committing)."""
        now = Holder.parse(self.slot.read())
        if now is None or now.token != self.holder.token:
            taken = f"now held by {now.describe()}" if now else "removed"
            raise IngestClaimedError(f"DEST {self.dest}: this ingest's claim {self.slot.where} was {taken} while "
                                     "it ran; nothing was committed and what is at DEST was left as it is: rerun "
                                     "when no other ingest writes there")

    def release(self) -> None:
        """Delete the claim if it is still this ingest's; a failure is logged, never raised over the result."""
        try:
            now = Holder.parse(self.slot.read())
            if now is not None and now.token == self.holder.token:
                self.slot.remove()
        except (OSError, GraphstoreError) as exc:
            logger.warning("could not delete the ingest claim %s (%s); delete it before the next ingest into %s",
                           self.slot.where, exc, self.dest)


@contextlib.contextmanager
def claimed(location: Location) -> Iterator[Claim | None]:
    """Hold the claim on ``location`` for the ``with`` block, released however it ends (Ctrl-C too).

    ``None`` for a location that offers no claim slot (then concurrent ingests are not detected).

    Examples
    --------
    >>> with claimed(open_location("/tmp/ds")) as claim:  # doctest: +SKIP
    ...     claim.check()  # still ours: safe to commit
    """
    claim = take_claim(location)
    try:
        yield claim
    finally:
        if claim is not None:
            claim.release()


def take_claim(location: Location) -> Claim | None:
    """Create the claim on ``location``, clearing a dead ingest's; refuse one held by a live (or unknown) one."""
    slot = _slot(location)
    if slot is None:
        logger.warning("%s offers no ingest claim; a second ingest into it at the same time is not detected",
                       location.url)
        return None
    holder = Holder.here(location.url)
    for _ in range(_ATTEMPTS):
        created = _on_storage(location, slot, lambda: slot.create(holder.to_bytes()))
        raw, other = _read(location, slot)
        if other is not None and other.token == holder.token:
            return Claim(slot, holder, location.url)  # ours (read back; a retried create also lands here)
        if raw is None:
            continue  # released (or removed) meanwhile: try again
        if created or other is None or not other.is_dead():
            raise _refusal(location.url, slot, other)
        logger.warning("DEST %s: clearing the claim %s of a dead ingest (%s)", location.url, slot.where,
                       other.describe())
        _on_storage(location, slot, lambda: slot.set_aside(raw))
    raise IngestClaimedError(f"DEST {location.url}: other ingests keep taking the claim {slot.where}; wait for "
                             "them to finish, then rerun")


def _slot(location: Location) -> ClaimSlot | None:
    make = getattr(location, "claim_slot", None)  # a capability: locations without one are written unclaimed
    return make() if make is not None else None


def _read(location: Location, slot: ClaimSlot) -> tuple[bytes | None, Holder | None]:
    """The claim's bytes and holder; a claim just created reads empty for a moment, so unreadable is retried."""
    for attempt in range(_READ_TRIES):
        raw = _on_storage(location, slot, slot.read)
        holder = Holder.parse(raw)
        if raw is None or holder is not None:
            return raw, holder
        time.sleep(0.02 * (attempt + 1))
    return raw, None


def _refusal(dest: str, slot: ClaimSlot, other: Holder | None) -> IngestClaimedError:
    if other is None:
        return IngestClaimedError(f"DEST {dest} has an ingest claim graphstore cannot read ({slot.where}); if no "
                                  "ingest writes there, delete that file and rerun")
    if other.on_this_machine():
        return IngestClaimedError(f"DEST {dest} is being written by another ingest ({other.describe()}); wait for "
                                  f"it to finish, or stop it (kill {other.pid}) and rerun")
    return IngestClaimedError(f"DEST {dest} is being written by another ingest ({other.describe()}); wait for it "
                              f"to finish; if it is dead (this host cannot tell), delete the claim {slot.where} "
                              "and rerun")


def _on_storage(location: Location, slot: ClaimSlot, fn: Any) -> Any:
    """``fn()``, with a local file-system error named as the DEST's (remote slots raise graphstore errors)."""
    try:
        return fn()
    except GraphstoreError:
        raise
    except OSError as exc:
        raise local_error(f"DEST {location.url}", f"taking the ingest claim {slot.where}", exc,
                          "nothing was written") from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _machine() -> str:
    """This kernel's boot ID and this process's PID namespace: where one pid means one process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _pid_start(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot); ``""`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""
