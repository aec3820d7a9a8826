"""PNG plots of a benchmark run: throughput and latency, scale-out, caches, quality."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
        right.axhline(100, color="red", linestyle="--", linewidth=1, label="100 ms target at 1,000/s")
        right.set_ylabel("send to visible on plan-invalidations (ms)")
        right.set_title("Latency at fixed input rates")
        right.legend()
        names.append(_save(fig, directory, f"{stem}-invalidation.png"))
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
