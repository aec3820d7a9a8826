"""The bench's writer-beside-the-loop figures: the same work alone, beside a busy process, beside a busy thread."""

from __future__ import annotations

from bench.gil_cost import MODES, measure
from bench.summary import gil_lines


def test_the_same_writer_work_is_timed_alone_and_beside_a_busy_process_and_thread():
    result = measure(events=100, rounds=1)
    for mode in MODES:
        assert result[mode]["wall_s"] > 0 and result[mode]["cpu_s"] > 0
    assert set(result["wall_vs_alone"]) == {"beside_process", "beside_thread"}
    assert all(ratio > 0 for ratio in result["wall_vs_alone"].values())
    [title, _, text, _] = gil_lines(result)
    assert title.startswith("## The writer beside the event loop") and f"{result['events']:,} change events" in text
    assert gil_lines(None) == []


def test_the_writer_is_timed_at_the_workers_switch_interval_and_the_process_keeps_its_own(monkeypatch):
    import sys

    from bench import gil_cost
    from agents.stream.writer import SWITCH_INTERVAL_SECONDS

    seen = []
    monkeypatch.setattr(gil_cost, "_timed", lambda mode, events, share: seen.append(sys.getswitchinterval()) or (1, 1))
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)
    try:
        gil_cost._run("alone", 10, 0.5)
        assert seen == [SWITCH_INTERVAL_SECONDS] and sys.getswitchinterval() == 0.003
    finally:
        sys.setswitchinterval(before)
