"""Notice a peer's death before the group does: its web port refuses connections, so its partitions are read ahead."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from yarl import URL

from agents.shards.shard_restore import Shards

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.5
"""Seconds between knocks on the peers' web ports."""
PROBE_TIMEOUT = 0.5
"""Seconds a knock may take: one that times out says nothing (a busy peer), only a refusal counts."""

Connect = Callable[[str, int], Awaitable[tuple]]


class PeerWatch:
    """Knocks on the web port of every worker the group's last assignment names, twice a second.

    A worker killed -9 leaves its port closed, and the kernel refuses a connection at once, where
    the group notices only after its session timeout (and the embedded broker holds the rebalance
    half as long again). The partitions of a peer that refuses are kept as extra standby copies
    (`Shards.suspected`) and restored from their lanes meanwhile, so the assignment that gives
    them finds them whole. A peer that answers again, or an assignment that names it no more,
    ends the suspicion; the next move drops copies nobody needs.
    """

    def __init__(self, shards: Shards, owners: Callable[[], dict[int, str]], is_self: Callable[[str], bool],
                 wake: Callable[[], None], interval: float = PROBE_INTERVAL, timeout: float = PROBE_TIMEOUT,
                 connect: Connect = asyncio.open_connection) -> None:
        self.shards = shards
        self.owners = owners  # entity partition -> the web URL of the worker the group gave it (none: unknown)
        self.is_self = is_self
        self.wake = wake  # wakes the shard follower: the wanted lanes changed
        self.interval = interval
        self.timeout = timeout
        self.connect = connect
        self.gone: frozenset[str] = frozenset()  # peers' URLs that refused at the last knock
        self.noticed = 0  # peers found gone (for /healthz)

    async def step(self) -> float:
        """One knock on every peer (a background chore: a failure is recorded and retried); seconds to the next."""
        await self.check()
        return self.interval

    async def check(self) -> frozenset[int]:
        """Knock once on every peer; the partitions now suspected (those of peers that refused)."""
        known = self.owners()
        if not known:
            return self.shards.suspected  # unknown during a rebalance: what was suspected stays so
        owners = {p: url for p, url in known.items() if url and not self.is_self(url)}
        urls = sorted(set(owners.values()))
        refused = await asyncio.gather(*(self._refuses(u) for u in urls))
        gone = frozenset(u for u, r in zip(urls, refused, strict=True) if r)
        suspected = frozenset(p for p, url in owners.items() if url in gone)
        for url in sorted(gone - self.gone):
            self.noticed += 1
            log.warning("peer %s refuses connections (killed?): restoring its entity partitions %s ahead of the "
                        "group's rebalance", url, sorted(p for p, u in owners.items() if u == url),
                        extra={"reason": "peer_gone", "peer": url})
        self.gone = gone
        if suspected != self.shards.suspected:
            self.shards.suspected = suspected
            self.wake()
        return suspected

    async def _refuses(self, url: str) -> bool:
        where = URL(url)
        if where.host is None or where.port is None:
            return False
        try:
            _, writer = await asyncio.wait_for(self.connect(where.host, where.port), self.timeout)
        except ConnectionRefusedError:
            return True
        except (OSError, asyncio.TimeoutError):
            return False  # unreachable or slow: the group's session timeout judges it
        writer.close()
        return False
