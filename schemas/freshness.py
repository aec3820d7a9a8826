"""Freshness tokens: the input offsets a piece of state reflects, and the incarnation they belong to."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import orjson

_PREFIX = "ft2."


class BadToken(ValueError):
    """A freshness token that does not decode; send one this service returned."""


@dataclass(frozen=True)
class FreshnessToken:
    """A decoded token: offsets only mean something on the broker incarnation that assigned them."""

    cluster_id: str | None
    """Cluster whose topics the offsets index (None: the issuer did not know it)."""
    epoch: int | None
    """The issuing worker's rebase epoch (None for tokens issued by producers such as `freshplan load`)."""
    offsets: dict[str, dict[int, int]]
    """Input topic -> partition -> next offset reflected."""

    def same_incarnation(self, cluster_id: str | None, epoch: int) -> bool:
        """Whether these offsets index the topics a worker on (cluster_id, epoch) reads."""
        return self.cluster_id == cluster_id and (self.epoch is None or self.epoch == epoch)


def encode_token(offsets: dict[str, dict[int, int]], cluster_id: str | None = None, epoch: int | None = None) -> str:
    """Token for {topic: {partition: next offset not yet reflected}} on one broker incarnation."""
    doc = {"c": cluster_id, "e": epoch,
           "o": {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}}
    return _PREFIX + base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def read_token(token: str) -> FreshnessToken:
    """Decode a token; raises BadToken for anything this service did not issue."""
    if not isinstance(token, str) or len(token) > 65_536 or not token.startswith(_PREFIX):
        raise BadToken("at_least_as_fresh must be a freshness token returned by this version of freshplan "
                       "(ft2.…); select again without it to get one")
    raw = token[len(_PREFIX):]
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        cluster, epoch = doc["c"], doc["e"]
        if not (cluster is None or isinstance(cluster, str)) or not (epoch is None or type(epoch) is int):
            raise TypeError
        offsets = {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in doc["o"].items()}
        if any(o < 0 or o >= 2**63 or p < 0 or p >= 2**31 for parts in offsets.values() for p, o in parts.items()):
            raise ValueError
        return FreshnessToken(cluster, epoch, offsets)
    except (ValueError, TypeError, AttributeError, KeyError, orjson.JSONDecodeError):
        raise BadToken("at_least_as_fresh is not a valid freshness token; use one returned by "
                       "freshplan load or select") from None


def decode_token(token: str) -> dict[str, dict[int, int]]:
    """The offsets a token names; raises BadToken for anything else."""
    return read_token(token).offsets


def covers(current: dict[str, dict[int, int]], wanted: dict[str, dict[int, int]]) -> bool:
    """True when `current` reflects at least everything `wanted` names."""
    return all(current.get(t, {}).get(p, 0) >= o for t, parts in wanted.items() for p, o in parts.items())
