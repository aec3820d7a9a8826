"""PNG plots of a benchmark run: throughput, latency against input rate beside the relay, scale-out, caches, quality."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from bench.report import CPU_PER_WORKER_VS_1  # noqa: E402


def plots(result: dict, directory: Path, stem: str) -> list[str]:
    """PNG plots next to the summary; returns their file names."""
    names = []
    path = result.get("invalidation_path")
    if path:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        tp = path["throughput"]
        left.bar(["bare Faust agent\n(ceiling)", "freshplan"],
                 [tp["ceiling_bare_faust"]["events_per_second"], tp["freshplan"]["events_per_second"]],
                 color=["#999999", "#2a7ab0"])
        left.set_ylabel("events/s (one worker)")
        left.set_title("Invalidation path throughput")
        rates = list(path["latency_by_rate"])
        for i, q in enumerate(("p50_ms", "p95_ms", "p99_ms")):
            right.bar([x + i * 0.27 for x in range(len(rates))],
                      [path["latency_by_rate"][r][q] or 0 for r in rates], width=0.27, label=q[:3])
        right.set_xticks([x + 0.27 for x in range(len(rates))], [f"{int(r):,}/s" for r in rates])
        right.set_yscale("log")
        right.set_ylabel("send to visible on plan-invalidations (ms)")
        right.set_title("Latency at fixed input rates")
        right.legend()
        names.append(_save(fig, directory, f"{stem}-invalidation.png"))
        if path["latency_by_rate"]:
            names.append(latency_plot(path, directory, f"{stem}-latency.png"))
    scale = (path or {}).get("scale_out") or {}
    if scale.get("runs"):
        names.append(scale_plot(scale, directory, f"{stem}-scale.png"))
    caches = result.get("caches")
    if caches:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        contenders = list(caches["contenders"])
        left.bar(contenders, [caches["contenders"][c]["stale_serves"] for c in contenders], color="#c0392b")
        left.set_title(f"Stale serves of {caches['contenders']['freshplan']['serves']:,} reads")
        right.bar(contenders, [caches["contenders"][c]["recompilations"] for c in contenders], color="#2a7ab0")
        right.set_title("Recompilations")
        for axis in (left, right):
            axis.tick_params(axis="x", rotation=30)
        names.append(_save(fig, directory, f"{stem}-caches.png"))
    quality = result.get("quality")
    if quality:
        fig, axis = plt.subplots(figsize=(11, 4))
        keys = ("answer_decision_accuracy", "relevant_micro_recall", "abstention_recall",
                "answer_abstain_type_accuracy")
        contenders = list(quality["metrics"])
        for i, name in enumerate(contenders):
            axis.bar([x + i * 0.2 for x in range(len(keys))],
                     [quality["metrics"][name][k] or 0 for k in keys], width=0.2, label=name)
        axis.set_xticks([x + 0.3 for x in range(len(keys))], keys)
        axis.set_ylim(0, 1.05)
        axis.set_title(f"003 evaluation, corpus {quality['protocol'].get('corpus', 'policies')}")
        axis.legend()
        names.append(_save(fig, directory, f"{stem}-quality.png"))
    return names


def latency_plot(path: dict, directory: Path, name: str) -> str:
    """p50 and p99 against input rate (log x), freshplan's bench workload and the same-rate relay, p99 ratio noted.

    The hot plan and the spread, each at its own rate, are points beside the lines (with their relay's).
    """
    by_rate = sorted((int(r), v) for r, v in path["latency_by_rate"].items())
    rates = [r for r, _ in by_rate]
    fig, axis = plt.subplots(figsize=(9, 5.5))
    for q, style in (("p50_ms", ":"), ("p99_ms", "-")):
        axis.plot(rates, [_ms(v.get(q)) for _, v in by_rate], marker="o", linestyle=style, color="#2a7ab0",
                  label=f"freshplan, bench workload, {q[:3]}")
        axis.plot(rates, [_ms((v.get("relay") or {}).get(q)) for _, v in by_rate], marker="s", linestyle=style,
                  color="#888888", label=f"bare relay, {q[:3]}")
    for rate, v in by_rate:
        _note_ratio(axis, rate, v, v.get("relay"))
    bare = next((s for s in (path.get("relay_floor") or {}).get("stages", []) if s["stage_ms"] == 0), None)
    spread = path.get("spread")
    points = [("hot plan", path.get("hot_plan"), bare, "*")]
    points += [(f"{spread['plans']}-plan spread", spread, spread.get("relay"), "D")] if spread else []
    for label, ours, relay, marker in points:
        if ours and ours.get("p99_ms") is not None:
            axis.scatter([ours["rate"]], [ours["p99_ms"]], marker=marker, s=90, color="#c0392b", zorder=3,
                         label=f"freshplan, {label}, p99")
            if relay and relay.get("p99_ms") is not None:
                axis.scatter([ours["rate"]], [relay["p99_ms"]], marker=marker, s=90, color="#888888", zorder=3,
                             label=f"bare relay at the {label}'s rate, p99")
            _note_ratio(axis, ours["rate"], ours, relay, color="#c0392b", below=True)
    axis.set_xscale("log")
    axis.set_yscale("log")
    ticks = sorted(set(rates) | {int(ours["rate"]) for _, ours, _, _ in points if ours})
    axis.set_xticks(ticks, [f"{t:,}" for t in ticks])
    axis.minorticks_off()
    axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.margins(x=0.15)
    axis.set_xlabel("input rate (events/s, log)")
    axis.set_ylabel("send to visible on plan-invalidations (ms, log)")
    axis.set_title("Latency against input rate: freshplan beside a bare relay (labels: p99 ratio)")
    axis.legend(fontsize=7)
    return _save(fig, directory, name)


def _ms(value: float | None) -> float:
    return float("nan") if value is None else value  # a gap in the line, not a zero


def _note_ratio(axis, rate: float, ours: dict, relay: dict | None, color: str = "#2a7ab0", below: bool = False) -> None:
    """Write freshplan's p99 over the relay's beside freshplan's p99 point (`below` it for the points, which may
    share a rate with the lines)."""
    if ours.get("p99_ms") is None or not (relay or {}).get("p99_ms"):
        return
    axis.annotate(f"{ours['p99_ms'] / relay['p99_ms']:.1f}x", (rate, ours["p99_ms"]), textcoords="offset points",
                  xytext=(8, -12 if below else 6), fontsize=8, color=color)


def scale_plot(scale: dict, directory: Path, name: str) -> str:
    """Events/s, CPU seconds and state bytes per worker against the number of workers, with issue 28's targets."""
    runs = list(scale["runs"].values())
    counts = [run["workers"] for run in runs]
    one = scale["runs"]["1"]
    fig, (rate, cpu, size) = plt.subplots(1, 3, figsize=(14, 4))
    rate.plot(counts, [run["events_per_second"] for run in runs], marker="o", color="#2a7ab0", label="measured")
    rate.plot(counts, [one["events_per_second"] * n for n in counts], linestyle="--", color="#999999",
              label="linear from 1 worker")
    for run in runs:
        if not run["pinned"]:
            rate.annotate("not pinned", (run["workers"], run["events_per_second"]), textcoords="offset points",
                          xytext=(0, 8), ha="center", fontsize=8)
    rate.set_ylabel("events/s, whole cluster")
    rate.set_title("Throughput")
    single_cpu = one["per_worker"][0].get("cpu_seconds")
    single_mb = (one["per_worker"][0].get("state_bytes") or 0) / 2**20
    for axis, values, unit in ((cpu, lambda p: p.get("cpu_seconds"), 1), (size, lambda p: p.get("state_bytes"), 2**20)):
        for run in runs:
            points = [values(p) / unit for p in run["per_worker"] if values(p) is not None]
            axis.scatter([run["workers"]] * len(points), points, color="#2a7ab0", zorder=3)
    for n, cap in CPU_PER_WORKER_VS_1.items():
        if str(n) in scale["runs"] and single_cpu:
            cpu.hlines(cap * single_cpu, n - 0.3, n + 0.3, color="red", linestyle="--")
    cpu.plot(counts, [single_cpu / n if single_cpu else 0 for n in counts], linestyle=":", color="#999999",
             label="1/N of one worker's")
    cpu.set_ylabel("CPU s per worker, same input")
    cpu.set_title("CPU per worker (red: issue 28 target)")
    for figures in scale.get("scaling", {}).values():
        if figures.get("state_bound_bytes") and figures["workers"] > 1:
            size.hlines(figures["state_bound_bytes"] / 2**20, figures["workers"] - 0.3, figures["workers"] + 0.3,
                        color="red", linestyle="--")
    replicated = (scale.get("replicated") or {}).get("bytes")
    if replicated:
        size.axhline(replicated / 2**20, color="#999999", linestyle=":", label="replicated part")
    size.set_ylim(0, max(single_mb, 1) * 1.3)
    size.set_ylabel("DuckDB state per worker (MB)")
    size.set_title("State per worker (red: issue 28 bound)")
    rate.set_ylim(bottom=0)
    cpu.set_ylim(bottom=0)
    for axis in (rate, cpu, size):
        axis.set_xticks(counts)
        axis.set_xlabel("workers")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    return _save(fig, directory, name)


def _save(fig, directory: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(directory / name, dpi=110)
    plt.close(fig)
    return name
