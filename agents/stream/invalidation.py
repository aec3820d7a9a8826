"""Compatibility for callers written before the write path was split (bench/): an applier with its own plan writer."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from agents.stream.event_apply import EventApplier
from agents.stream.raw_message import RawMessage
from agents.plans.plan_writer import PlanWriter
from compiler.pipeline import CompiledPlan
from schemas.cdc_mapping import CdcMapping
from state.local_state import LocalState

__all__ = ["Invalidator", "RawMessage"]


class Invalidator(EventApplier):
    """`EventApplier` plus `PlanWriter`, constructed as the single class they replace was."""

    def __init__(self, state: LocalState, topic_of, max_event_bytes: int = 1_000_000, on_latency=None,
                 on_compile=None, eager_limit: int = 0, max_clock_jump: timedelta | None = timedelta(days=400),
                 cdc: CdcMapping | None = None) -> None:
        super().__init__(state, PlanWriter(state, topic_of, eager_limit, on_compile, on_latency), max_event_bytes,
                         max_clock_jump, cdc)

    def compile_select(self, request, counts: Counter[str], on_compile=None) -> CompiledPlan:
        """As `PlanWriter.compile_select` (so that `QueryService` takes either)."""
        return self.plans.compile_select(request, counts, on_compile)
