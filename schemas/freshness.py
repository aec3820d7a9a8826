"""Freshness tokens: the input offsets a piece of state reflects, the incarnation they belong to, and their MAC."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Iterable

import orjson

_PREFIX = "ft3."
_UNSIGNED = "ft2."  # issued before tokens were signed: refused like any token this service cannot vouch for
MAX_TOKEN_CHARS = 65_536


class BadToken(ValueError):
    """A freshness token that does not decode or is not signed by this service; send one it returned."""

    code = "token_invalid"


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


def _mac(key: bytes, body: str) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()).decode().rstrip("=")


def encode_token(offsets: dict[str, dict[int, int]], cluster_id: str | None = None, epoch: int | None = None, *,
                 key: bytes) -> str:
    """Token for {topic: {partition: next offset not yet reflected}} on one broker incarnation, signed with `key`."""
    doc = {"c": cluster_id, "e": epoch,
           "o": {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}}
    body = _PREFIX + base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")
    return f"{body}.{_mac(key, body)}"


def read_token(token: str, keys: Iterable[bytes]) -> FreshnessToken:
    """Check the MAC against every accepted key, then decode; raises BadToken for anything this service did not sign.

    The MAC is checked before the payload is parsed: nothing a caller made up is decoded.
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise BadToken("at_least_as_fresh must be a freshness token returned by freshplan (ft3.…); select "
                       "again without it to get one")
    if token.startswith(_UNSIGNED):
        raise BadToken("at_least_as_fresh is an unsigned token (from an older freshplan, or made by hand); "
                       "select again without it to get a signed one")
    body, dot, mac = token.rpartition(".")
    if not token.startswith(_PREFIX) or not dot or body == _PREFIX[:-1]:
        raise BadToken("at_least_as_fresh must be a freshness token returned by freshplan (ft3.…); select "
                       "again without it to get one")
    # Every key is compared, in constant time each: which key matched is no one's business.
    if not any([hmac.compare_digest(_mac(key, body), mac) for key in keys]):
        raise BadToken("at_least_as_fresh is not signed by this service (altered, made by hand, or signed with "
                       "a key retired since); select again without it to get a fresh token")
    return _decode(body)


def _decode(body: str) -> FreshnessToken:
    raw = body[len(_PREFIX):]
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
    """The offsets of a token its holder got from the service itself, MAC unchecked (tools and tests only).

    A worker never decides on it: requests go through `read_token`.
    """
    if not isinstance(token, str) or not token.startswith(_PREFIX):
        raise BadToken("not a freshness token")
    return _decode(token.rpartition(".")[0] if token.count(".") >= 2 else token).offsets


def covers(current: dict[str, dict[int, int]], wanted: dict[str, dict[int, int]]) -> bool:
    """True when `current` reflects at least everything `wanted` names."""
    return all(current.get(t, {}).get(p, 0) >= o for t, parts in wanted.items() for p, o in parts.items())
