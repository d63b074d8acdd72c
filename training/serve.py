"""``graphstore serve``: one sampler server of a group that holds a dataset's partitions and serves sampled
batches, features included, to trainers that hold none (``graphstore-train URL --servers HOST:PORT``)."""

from __future__ import annotations

import argparse
import logging
import signal
from datetime import timedelta
from typing import Any, Callable

import torch

from graphstore.cli.args import integer, number
from graphstore.errors import InvalidInputError

logger = logging.getLogger(__name__)

DESCRIPTION = """Serve a dataset's partitions to trainers that open none of its files (server-client mode).

Start S servers, one per machine that holds (serves) partitions, each with the same --address (server 0
listens there: the servers' rendezvous, which trainers are given too) and its own --rank. The servers share
the partitions as training ranks do, and sample across each other's over RPC. Trainers:
graphstore-train URL --servers HOST:PORT, or training.Session(url, servers="HOST:PORT") in your own script.
A server exits once every trainer of the job it served has gone: 0 when each finished, 1 when one left
without finishing; --keep-serving serves the next job instead (stop it with SIGTERM or Ctrl-C)."""


def register(sub: Any) -> Callable[[argparse.Namespace], int]:
    """Add ``serve`` to the ``graphstore`` command's subcommands; returns its handler."""
    cmd = sub.add_parser("serve", help="sampler server: serve a dataset's partitions to trainers that hold none",
                         description=DESCRIPTION)
    cmd.add_argument("dataset", help="dataset URL or path (the same on every server)")
    cmd.add_argument("--address", required=True, metavar="HOST:PORT",
                     help="the servers' rendezvous, where server 0 listens (the same on every server and trainer)")
    cmd.add_argument("--servers", type=integer(1, 4096), default=1, metavar="S", help="how many servers (default 1)")
    cmd.add_argument("--rank", type=integer(0, 4095), default=0, metavar="I", help="this server's rank, 0..S-1")
    cmd.add_argument("--loader-workers", type=integer(0, 256), default=0, metavar="W",
                     help="sampler processes per trainer loader (default 0: the connections' threads build batches)")
    cmd.add_argument("--timeout", type=number(0, above=True), default=120.0,
                     help="seconds before a silent peer server ends this one (default 120)")
    cmd.add_argument("--keep-serving", action="store_true", help="serve the next job when a job ends")
    cmd.add_argument("--interface", metavar="NAME",
                     help="network interface for the servers' RPC and for trainers (default: the route to HOST)")
    cmd.add_argument("--threads", type=integer(1, 4096), default=None, metavar="N", help="torch threads")
    return _command


def _command(args: argparse.Namespace) -> int:
    from sampling.remote.client import parse_address

    host, port = parse_address(args.address, "--address")
    if args.rank >= args.servers:
        raise InvalidInputError(f"--rank {args.rank} with --servers {args.servers}: give a rank in 0..{args.servers - 1}")
    return serve(args.dataset, host, port, args.servers, args.rank, loader_workers=args.loader_workers,
                 timeout=args.timeout, keep_serving=args.keep_serving, interface=args.interface, threads=args.threads)


def serve(url: str, host: str, port: int, servers: int, rank: int, *, loader_workers: int = 0,
          timeout: float = 120.0, keep_serving: bool = False, interface: str | None = None,
          threads: int | None = None) -> int:
    """Run sampler server ``rank`` of ``servers`` until its job ends; the exit code.

    Examples
    --------
    >>> serve("graphs/cora", "10.0.0.1", 29600, servers=2, rank=0)  # doctest: +SKIP
    0
    """
    import torch.distributed as dist

    from sampling.remote.client import SERVERS_KEY, server_key
    from sampling.remote.sampler_server import SamplerServer, ServedPartitions
    from training.cluster import process_groups
    from training.cluster.world import World
    from training.loop.session import Session

    world = World(rank, servers, 0, f"tcp://{host}:{port}", master_addr=host)
    session = Session(url, world=world, timeout=timeout, loader_workers=loader_workers, interface=interface,
                      threads=threads)
    session.start()
    server = None
    failure: BaseException | None = None
    try:
        listen = process_groups.HOSTS.get(rank, process_groups.HOSTS.get(-1, "127.0.0.1")).split()[0]
        served = ServedPartitions(session.dataset, session.transport, session.layout, session.stats,
                                  lambda fields: seeds(session, fields), lambda: largest_labels(session),
                                  loader_workers, lambda exc: lost_server(exc, rank))
        server = SamplerServer(served, listen, keep_serving).start()
        # the rendezvous store itself (the process group's adds a prefix to every key), where trainers look
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
        store.set(server_key(rank), server.address)
        session.barrier()  # every server's address is published before trainers learn how many there are
        if rank == 0:
            store.set(SERVERS_KEY, str(servers))
        logger.warning("sampler server %d of %d: partitions %s of %s, trainers served at %s (graphstore-train %s "
                       "--servers %s:%d)", rank, servers, list(session.parts), url, server.address, url, host, port)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda number, frame: server._ended.put((0, f"stopped by signal {number}")))
        code, what = server.wait()
        logger.warning("sampler server %d: %s; %d batches served", rank, what, server.batches)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        if server is not None:
            server.close()
        if failure is not None:
            session.close(failure)
    try:
        session.close()
    except Exception as exc:  # a peer server was lost: named in one line, as a training rank names it
        logger.error("sampler server %d: %s", rank, " ".join(str(session.explain(exc)).split()))
        return 1
    return code


def lost_server(exc: BaseException, rank: int) -> BaseException:
    """A request that failed because a peer server did not answer, as the trainer is told it: naming that
    server and its host (the trainer knows servers by number and address, not by RPC rank)."""
    from sampling.distributed.transport import PeerError
    from training.cluster import process_groups

    peer = getattr(exc, "peer", None)
    if not isinstance(exc, PeerError) or peer is None or "did not answer" not in str(exc):
        return exc
    host = process_groups.HOSTS.get(peer, "an unknown host")
    return process_groups.PeerFailure(f"sampler server {rank} lost sampler server {peer} at {host} while sampling "
                                      f"across it: {' '.join(str(exc).split())}")


def seeds(session: Any, fields: dict[str, Any]) -> list[torch.Tensor]:
    """This server's share of the seeds a trainer asks for: a node mask's nodes (``None``: all), or a link
    split's links (stored, or computed by the trainer's ``rule``; their times when ``time_attr`` is an edge
    attribute)."""
    from sampling.distributed.dist_loader import local_seeds
    from sampling.remote.specs import rule_in
    from training.loop.session_loaders import link_seeds

    if fields.get("what") == "node":
        node_type = fields.get("node_type")
        return [local_seeds(session.dataset, session.parts, fields.get("mask"), session.layout, session.rank,
                            node_type=node_type)]
    etype = fields.get("edge_type")
    etype = tuple(etype) if isinstance(etype, list) else etype
    index, _, extra = link_seeds(session, fields["split"], etype, fields.get("time_attr"), rule_in(fields.get("rule")))
    index = index[1] if isinstance(index, tuple) else index
    return [index] + ([extra["edge_label_time"]] if "edge_label_time" in extra else [])


def largest_labels(session: Any) -> list[list[Any]]:
    """``[node type, largest label on this server's partitions]`` for each labelled node type."""
    from training.loop.session import max_label

    types = [n.name for n in session.dataset.manifest.node_types if "y" in n.attrs]
    return [[t, max_label(session.dataset, session.parts, t)] for t in types]
