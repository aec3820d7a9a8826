"""Freshness tokens: the input offsets a piece of state reflects, as an opaque string."""

from __future__ import annotations

import base64

import orjson

_PREFIX = "ft1."


class BadToken(ValueError):
    """A freshness token that does not decode; send one this service returned."""


def encode_token(offsets: dict[str, dict[int, int]]) -> str:
    """Token for {topic: {partition: next offset not yet reflected}}."""
    doc = {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}
    return _PREFIX + base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


def decode_token(token: str) -> dict[str, dict[int, int]]:
    """The offsets a token names; raises BadToken for anything else."""
    if not isinstance(token, str) or not token.startswith(_PREFIX):
        raise BadToken("at_least_as_fresh must be a freshness token returned by freshplan (ft1.…)")
    raw = token[len(_PREFIX):]
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in doc.items()}
    except (ValueError, TypeError, AttributeError, orjson.JSONDecodeError):
        raise BadToken("at_least_as_fresh is not a valid freshness token; use one returned by "
                       "freshplan load or select") from None


def covers(current: dict[str, dict[int, int]], wanted: dict[str, dict[int, int]]) -> bool:
    """True when `current` reflects at least everything `wanted` names."""
    return all(current.get(t, {}).get(p, 0) >= o for t, parts in wanted.items() for p, o in parts.items())
