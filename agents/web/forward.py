"""Find the worker that owns a partition and have it answer a select."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

import aiohttp
import orjson
from yarl import URL

log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Freshplan-Forwarded"
"""Set on a forwarded select: the owner answers it itself and never forwards it again."""
RETRY_AFTER_SECONDS = 1
"""What a refused caller is told to wait: a rebalance or restart settles in a few seconds."""
FORWARD_TIMEOUT_SECONDS = 10.0
"""Default bound on one forwarded select, connection included."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""Largest answer read from an owner; a larger one is refused, not buffered."""


def owner_url(app: Any, topic: str, partition: int) -> str | None:
    """The web URL of the member the consumer group gave `topic`/`partition`, or None if unknown now.

    Faust's assignor (faust-streaming 0.15.3, `PartitionAssignor`) sends every member the
    whole group's assignment with each member's `canonical_url`; `external_topics_metadata()`
    is that map, url -> topic -> partitions, for topics that are not table changelogs (ours:
    there are no tables). It is what `app.router.external_topic_key_store` reads, keyed here by
    partition rather than by a key. Before the first assignment, and for a topic the group
    does not consume, there is no owner: None.
    """
    return owners(app, topic).get(partition)


def owners(app: Any, topic: str) -> dict[int, str]:
    """Every partition of `topic` the group's last assignment gave, with its member's web URL (see `owner_url`)."""
    try:
        hosts = app.assignor.external_topics_metadata()
    except Exception:  # noqa: BLE001 - no consumer, no assignor yet: nobody is known to own anything
        return {}
    return {p: str(url) for url, topics in (hosts or {}).items() for p in (topics or {}).get(topic, ())}


def is_self(app: Any, url: str | None) -> bool:
    """Whether `url` is this worker's own canonical URL (then nothing is forwarded)."""
    if url is None:
        return False
    mine, other = URL(str(app.conf.canonical_url)), URL(url)
    return (mine.host, mine.port) == (other.host, other.port)


def is_forwarded(headers: Mapping[str, str]) -> bool:
    """Whether a request was forwarded by another worker (and so must not be forwarded again)."""
    return bool(headers.get(FORWARDED_HEADER))


def owner_unavailable(why: str) -> tuple[int, dict[str, Any]]:
    """The 503 refusal for a select whose owner cannot answer: retry, never a possibly stale plan."""
    return 503, {"error": {
        "code": "owner_unavailable", "pass": "forward", "retry_after": RETRY_AFTER_SECONDS,
        "message": f"The worker that owns this entity's plans {why}, and no other worker may answer for it; "
                   f"retry in {RETRY_AFTER_SECONDS} s (ownership moves to a live worker within the session "
                   "timeout)."}}


def shard_restoring(partition: int) -> tuple[int, dict[str, Any]]:
    """The 503 refusal for a select whose entity's shard this worker is still restoring: never a partial answer."""
    return 503, {"error": {
        "code": "shard_restoring", "pass": "forward", "retry_after": RETRY_AFTER_SECONDS,
        "message": f"This worker was just given entity partition {partition} and is still restoring its resources "
                   f"from source-changes; retry in {RETRY_AFTER_SECONDS} s (it answers once the shard is whole)."}}


def retry_headers(status: int, doc: Any) -> dict[str, str]:
    """`Retry-After` for an owner_unavailable refusal, to send with it; empty otherwise."""
    error = doc.get("error") if isinstance(doc, dict) else None
    if status == 503 and isinstance(error, dict) and error.get("code") in ("owner_unavailable", "shard_restoring"):
        return {"Retry-After": str(error.get("retry_after", RETRY_AFTER_SECONDS))}
    return {}


async def forward_select(url: str, body: Any, headers: Mapping[str, str],
                         timeout: float = FORWARD_TIMEOUT_SECONDS,
                         session: aiohttp.ClientSession | None = None) -> tuple[int, dict[str, Any]]:
    """POST the select to the owner at `url`; its status and JSON answer, or owner_unavailable."""
    return await forward_request(url, "/v1/select", body, headers, timeout, session)


async def forward_request(url: str, path: str, body: Any, headers: Mapping[str, str],
                          timeout: float = FORWARD_TIMEOUT_SECONDS,
                          session: aiohttp.ClientSession | None = None) -> tuple[int, dict[str, Any]]:
    """Send a request for an owned plan to the owner at `url` (POST `body`, or GET when it is None).

    Only the caller's `Authorization` goes along (the owner checks it again), with
    `FORWARDED_HEADER`, and its `Host`: the owner's DNS-rebinding guard accepts the names the
    caller used (FRESHPLAN_ALLOWED_HOSTS), not necessarily the address in its canonical URL.
    A 2xx answer names the worker that served it in `served_by` unless the owner did.
    `session` (e.g. Faust's `app.http_client`) saves a connection per call.
    """
    sent = {"Accept": "application/json", FORWARDED_HEADER: "1"}
    if body is not None:
        sent["Content-Type"] = "application/json"
    authorization = headers.get("Authorization") or headers.get("authorization")
    if authorization:
        sent["Authorization"] = authorization
    host = headers.get("Host") or headers.get("host")
    if host:
        sent["Host"] = host
    own = session is None
    http = session or aiohttp.ClientSession()
    try:
        async with http.request("GET" if body is None else "POST", f"{url.rstrip('/')}{path}",
                                data=None if body is None else orjson.dumps(body), headers=sent,
                                timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False) as resp:
            raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        log.warning("forwarding %s to %s failed: %s", path, url, type(exc).__name__,
                    extra={"error_class": "owner_unavailable", "owner": url})
        return owner_unavailable("did not answer in time" if isinstance(exc, asyncio.TimeoutError)
                                 else "cannot be reached")
    finally:
        if own:
            await http.close()
    try:
        if len(raw) > MAX_ANSWER_BYTES:
            raise ValueError("answer too large")
        doc = orjson.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("answer is not a JSON object")
    except ValueError as exc:  # orjson's decode error is one
        log.warning("the owner at %s answered a forwarded %s with status %d and no usable JSON (%s)", url, path,
                    status, exc, extra={"error_class": "owner_unavailable", "owner": url})
        return owner_unavailable("answered with something other than a plan")
    if not (200 <= status < 300 or 400 <= status < 500 or status == 503):
        # A redirect or a server error is no answer; the owner's own 503s carry their reason.
        log.warning("the owner at %s answered a forwarded %s with status %d", url, path, status,
                    extra={"error_class": "owner_unavailable", "owner": url})
        return owner_unavailable("failed to answer")
    if status < 300:
        doc.setdefault("served_by", url)
    return status, doc
