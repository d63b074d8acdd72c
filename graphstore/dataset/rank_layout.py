"""Which rank serves which partitions: the cluster's layout, which every layer reads (sampling asks a
partition's owner, training splits seeds, the launcher checks a job)."""

from __future__ import annotations

from dataclasses import dataclass

from graphstore.errors import InvalidInputError


@dataclass(frozen=True)
class RankLayout:
    """Which rank holds which partitions, for any rank count over any partition count.

    A partition is storage (fixed at ingest), a rank is compute (whatever hardware is at hand). With
    fewer ranks than partitions, rank r owns a contiguous block of them (``parts_of``: ``P // W`` or one
    more each), which is one contiguous range of global IDs per node type. With at least as many ranks
    as partitions, each partition is held by a group of consecutive ranks (``W // P`` or one more each;
    one machine's, under torchrun/SLURM), which split its seeds, and any of them answers for it.

    Examples
    --------
    >>> RankLayout(4, 3).parts_of(1), RankLayout(2, 3).ranks_of(0)
    ((1,), range(0, 2))
    """

    num_parts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.num_parts < 1:
            raise InvalidInputError(f"{self.world_size} rank(s) over {self.num_parts} partition(s): both must be "
                                    ">= 1; change --nproc / --nnodes x --nproc-per-node")

    def parts_of(self, rank: int) -> tuple[int, ...]:
        """The partitions ``rank`` serves (and takes its seeds from), in order."""
        p, w = self.num_parts, self.world_size
        if w <= p:
            return tuple(range(rank * p // w, (rank + 1) * p // w))
        return (next(q for q in range(p) if rank in self.ranks_of(q)),)

    def part_of(self, rank: int) -> int:
        """The first partition ``rank`` serves."""
        return self.parts_of(rank)[0]

    def ranks_of(self, part: int) -> range:
        """The ranks that serve ``part`` (one when ranks are fewer than partitions)."""
        p, w = self.num_parts, self.world_size
        if w <= p:
            return range(self.owner_of(part), self.owner_of(part) + 1)
        return range(part * w // p, (part + 1) * w // p)

    def owner_of(self, part: int) -> int:
        """The first rank serving ``part``."""
        p, w = self.num_parts, self.world_size
        if w > p:
            return part * w // p
        return next(r for r in range(w) if r * p // w <= part < (r + 1) * p // w)

    def share(self, rank: int, part: int) -> tuple[int, int]:
        """``(i, n)``: ``rank`` is the i-th of the n ranks that split ``part``'s seeds."""
        ranks = self.ranks_of(part)
        return ranks.index(rank), len(ranks)

    @property
    def ranks_per_part(self) -> int:
        """Ranks per partition when every partition has the same number (else the smallest)."""
        return max(1, self.world_size // self.num_parts)

    def server(self, part: int, caller: int) -> int:
        """The rank of ``part`` that answers ``caller`` (callers spread over the partition's ranks)."""
        ranks = self.ranks_of(part)
        return ranks[caller % len(ranks)]
