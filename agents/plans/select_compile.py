"""Compile the requests of selects that waited for the writer together, each alone when that fails."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Sequence

import duckdb

from compiler.batch import compile_many
from compiler.cedar_batch import SharedEntities
from compiler.errors import RequestError
from compiler.pipeline import CompiledPlan, compile_request
from schemas.timefmt import format_instant

if TYPE_CHECKING:
    from agents.plans.plan_writer import PlanWriter

log = logging.getLogger(__name__)

CEDAR_CHUNK = 8  # selects per Cedar call: the HTTP loop waits for each call, as it does for the backlog's chunks


def compile_requests(writer: "PlanWriter", requests: Sequence, now: datetime | None, on_compile=None,
                     ) -> list[CompiledPlan | Exception]:
    """Per parsed request its plan, or the exception its caller gets (a RequestError, or a bug met compiling it).

    A duckdb.Error is raised: the file failed, and every select of the job is refused (`state_unreadable`).
    """
    together = _together(writer, requests, now, on_compile) if len(requests) > 1 else None
    if together is not None:
        return together
    out: list[CompiledPlan | Exception] = []
    for request in requests:
        started = time.perf_counter()
        try:
            out.append(compile_request(request, writer.state.catalog, now))
        except RequestError as exc:
            out.append(exc)
        except duckdb.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug met by one request is that caller's alone
            log.exception("compiling a selected request failed")
            out.append(exc)
        if on_compile:
            on_compile(time.perf_counter() - started)
    return out


def _together(writer: "PlanWriter", requests: Sequence, now: datetime | None, on_compile=None,
              ) -> list[CompiledPlan | Exception] | None:
    """Compiled as the backlog compiles: principals, entities and candidates read in a few statements, Cedar asked
    once. Alone, each select read its own (some 25 statements, and under a stream a wait for the interpreter lock
    after each: 20-60 ms a select). None when something other than a RequestError was met."""
    started = time.perf_counter()
    try:
        view, shared = writer.snapshot([_prefetched(r) for r in requests], now), SharedEntities()
        out: list[CompiledPlan | Exception] = []
        for start in range(0, len(requests), CEDAR_CHUNK):  # Cedar holds the GIL for a whole call: the loop waits
            out += compile_many(requests[start:start + CEDAR_CHUNK], view, now, shared)
    except duckdb.Error:
        raise
    except Exception:  # noqa: BLE001 - compiled alone next, where the error reaches its own caller only
        log.exception("compiling %d selects together failed; each is compiled alone", len(requests))
        return None
    if on_compile:
        each = (time.perf_counter() - started) / len(requests)
        for _ in requests:
            on_compile(each)
    return out


def _prefetched(request) -> dict:
    """What `CatalogSnapshot.prefetch` reads of a parsed request (it takes stored request documents)."""
    doc = {"principal": request.principal, "entity": request.entity, "decision_type": request.decision_type}
    if request.decision_time is not None:
        doc["decision_time"] = format_instant(request.decision_time)
    return doc
