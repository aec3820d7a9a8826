"""The latency-against-rate plot: freshplan beside the relay, drawn from whatever the run measured."""

from __future__ import annotations

from bench.plots import latency_plot, plots


def _stream(p99: float, **over) -> dict:
    return dict({"p50_ms": p99 / 2, "p95_ms": p99, "p99_ms": p99}, **over)


def test_the_latency_plot_is_written_with_the_hot_plan_and_spread_beside_the_lines(tmp_path):
    path = {"latency_by_rate": {"100": _stream(30.0, relay=_stream(10.0)), "1000": _stream(90.0, relay=None),
                                "5000": {"p50_ms": None, "p99_ms": None}},  # nothing measured: gaps, not zeros
            "hot_plan": _stream(60.0, rate=200.0), "relay_floor": {"stages": [dict(_stream(20.0), stage_ms=0.0)]},
            "spread": _stream(80.0, rate=1000.0, plans=40, relay=_stream(25.0))}
    name = latency_plot(path, tmp_path, "x-latency.png")
    assert name == "x-latency.png" and (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_with_latency_figures_lists_the_latency_plot_among_its_images(tmp_path):
    path = {"throughput": {"ceiling_bare_faust": {"events_per_second": 10}, "freshplan": {"events_per_second": 3}},
            "latency_by_rate": {"100": _stream(30.0, relay=_stream(10.0))}}
    assert plots({"invalidation_path": path}, tmp_path, "d") == ["d-invalidation.png", "d-latency.png"]
    assert (tmp_path / "d-latency.png").stat().st_size > 5_000
