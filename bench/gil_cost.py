"""What sharing a process with the event loop costs the writer: the same apply work alone, beside a busy process,
beside a busy thread of its own process."""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from agents.plans.backlog import PASS_PLANS, recompile_queued
from agents.stream.writer import SWITCH_INTERVAL_SECONDS
from bench.workload import generate, warm_in_process
from state.local_state import LocalState

# The companion works this share of every PERIOD and sleeps the rest: a worker's event loop was busy about half of
# the time at 1,000 events/s on the bench workload (py-spy over the loop thread, 2026-12-07).
BUSY_SHARE = 0.5
PERIOD = 0.002
MODES = ("alone", "beside_process", "beside_thread")
BATCH = 100  # events per apply batch, about what a worker's batches held at 1,000 events/s


def _busy(stop, share: float) -> None:
    """Python work for `share` of every PERIOD until `stop` is set (the event loop's stand-in)."""
    n = 0
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < PERIOD * share:
            n += 1
        time.sleep(PERIOD * (1 - share))


def _run(mode: str, events: int, share: float) -> tuple[float, float]:
    """Apply the bench workload's change stream in batches, compiling successors between them; (wall s, CPU s).

    At the worker's GIL switch interval (`freshplan run` sets it), not Python's 5 ms default.
    """
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    try:
        return _timed(mode, events, share)
    finally:
        sys.setswitchinterval(interval)


def _timed(mode: str, events: int, share: float) -> tuple[float, float]:
    workload = generate(plans=200, changes=events)
    with tempfile.TemporaryDirectory(prefix="fpbench-gil-") as tmp:
        state = LocalState.open(Path(tmp) / "state.duckdb")
        try:
            applier, stream = warm_in_process(state, workload)
            companion = None
            if mode == "beside_process":
                stop = multiprocessing.get_context("spawn").Event()
                companion = multiprocessing.get_context("spawn").Process(target=_busy, args=(stop, share), daemon=True)
            elif mode == "beside_thread":
                stop = threading.Event()
                companion = threading.Thread(target=_busy, args=(stop, share), daemon=True)
            if companion is not None:
                companion.start()
                time.sleep(0.3)  # a spawned process imports first
            started, cpu = time.perf_counter(), time.thread_time()
            for i in range(0, len(stream), BATCH):
                applier.apply(stream[i:i + BATCH])
                while recompile_queued(applier.plans, PASS_PLANS):
                    pass
            wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
            if companion is not None:
                stop.set()
                companion.join(timeout=10)
        finally:
            state.close()
    return wall, cpu


def measure(events: int = 3000, rounds: int = 2, share: float = BUSY_SHARE) -> dict:
    """Median wall and CPU seconds of the same writer work per mode, rounds interleaved, and the ratios to alone."""
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            runs[mode].append(_run(mode, events, share))
    out: dict = {"events": events, "rounds": rounds, "batch": BATCH, "busy_share": share, "period_ms": PERIOD * 1000}
    for mode in MODES:
        out[mode] = {"wall_s": round(statistics.median(w for w, _ in runs[mode]), 3),
                     "cpu_s": round(statistics.median(c for _, c in runs[mode]), 3)}
    alone = out["alone"]["wall_s"]
    out["wall_vs_alone"] = {mode: round(out[mode]["wall_s"] / alone, 2) if alone else None for mode in MODES[1:]}
    return out
