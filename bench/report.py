"""Write a benchmark run: the JSON result, the replayable quality file, a Markdown summary and PNG plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import orjson  # noqa: E402

OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def write_json(path: Path, doc: dict) -> None:
    """Sorted keys and fixed indentation, so that equal payloads are equal bytes."""
    path.write_bytes(orjson.dumps(doc, option=OPTIONS) + b"\n")


def targets(result: dict) -> list[dict]:
    """Each target of the benchmark issue with the measured value and whether it was met."""
    rows = []
    path = result.get("invalidation_path")
    if path:
        ratio = path["throughput"]["ratio_to_ceiling"]
        rows.append(_row("events/s vs bare Faust agent", ">= 70% of the ceiling", ratio, 0.70, ">=", "{:.1%}"))
        lat = path["latency_by_rate"].get("1000")
        if lat:
            rows.append(_row("p99 event-to-invalidation at 1,000 events/s", "<= 50 ms", lat["p99_ms"], 50, "<=",
                             "{:.0f} ms"))
        fan = path["fanout"]
        scaled = fan["all_published_seconds"] * 100_000 / max(1, fan["fanout_plans"])
        label = "100,000-plan fan-out published" + ("" if fan["fanout_plans"] >= 100_000 else
                                                    f" (extrapolated linearly from {fan['fanout_plans']:,} plans)")
        rows.append(_row(label, "<= 2 s", round(scaled, 2), 2.0, "<=", "{:.1f} s"))
    caches = result.get("caches")
    if caches:
        fp = caches["contenders"]["freshplan"]
        rows.append(_row("stale serves (freshplan)", "0", fp["stale_serves"], 0, "<=", "{}"))
        share = fp["unnecessary_invalidations"] / fp["invalidations"] if fp["invalidations"] else 0.0
        rows.append(_row("unnecessary invalidations announced", "< 10%", share, 0.10, "<", "{:.1%}"))
    index = result.get("index")
    if index:
        rows.append(_row("index bytes per plan (on disk)", "< 1 KiB", index["memory_per_plan"]["file_bytes_per_plan"],
                         1024, "<", "{:.0f} B"))
    return rows


def _row(what: str, target: str, value, bound, op: str, fmt: str) -> dict:
    met = value is not None and {"<=": value <= bound, ">=": value >= bound, "<": value < bound}[op]
    if value is None or met:
        gap = None
    elif op == ">=":
        gap = f"{bound / value:.1f}x short" if value else "not measured"
    else:
        gap = f"{value / bound:.1f}x over" if bound else f"{value} over"
    return {"measure": what, "target": target, "value": value, "shown": "n/a" if value is None else fmt.format(value),
            "met": met, "gap": gap}


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
        right.axhline(50, color="red", linestyle="--", linewidth=1, label="50 ms target")
        right.set_ylabel("event to invalidation (ms)")
        right.set_title("Latency at fixed input rates")
        right.legend()
        names.append(_save(fig, directory, f"{stem}-invalidation.png"))
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
        axis.set_title("003 evaluation (24 frozen queries, 3 tenants)")
        axis.legend()
        names.append(_save(fig, directory, f"{stem}-quality.png"))
    return names


def _save(fig, directory: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(directory / name, dpi=110)
    plt.close(fig)
    return name
