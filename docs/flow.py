"""Draws docs/flow.png, the README's picture of how data flows: `python docs/flow.py [OUT.png]`."""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: the picture is rendered to a file, here and in the test
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

INPUTS = ("source-changes", "policy-versions", "revocations", "clock")
STAGES = ("apply to DuckDB state", "look up the dependency index", "invalidate affected plans",
          "recompile them")
OUTPUTS = ("plan-invalidations", "plans", "receipts", "dead-letters")
TOPIC, STAGE, HTTP = "#dbe8f6", "#fbe6c8", "#dff2dc"


def _box(ax, x: float, y: float, w: float, h: float, text: str, colour: str, size: float = 9) -> None:
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02", fc=colour, ec="#555555"))
    ax.text(x, y, text, ha="center", va="center", fontsize=size, family="DejaVu Sans")


def _arrow(ax, start: tuple[float, float], end: tuple[float, float], label: str = "") -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": "#444444", "lw": 1.2})
    if label:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, label, ha="center", fontsize=8,
                color="#444444")


def draw(out: Path) -> None:
    """Render the picture to `out` (PNG, no timestamp in its metadata, so a rerun changes nothing)."""
    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=100)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    ax.text(0.3, 4.95, "Kafka topics in", fontsize=10, weight="bold")
    ax.text(3.55, 4.95, "freshplan worker", fontsize=10, weight="bold")
    ax.text(7.75, 4.95, "Kafka topics out", fontsize=10, weight="bold")
    for i, name in enumerate(INPUTS):
        y = 4.4 - i * 0.75
        _box(ax, 1.2, y, 1.8, 0.5, name, TOPIC)
        _arrow(ax, (2.1, y), (3.15, 4.4 - i * 0.07))
    for i, name in enumerate(STAGES):
        y = 4.4 - i * 0.85
        _box(ax, 4.6, y, 2.9, 0.5, f"{i + 1}. {name}", STAGE)
        if i:
            _arrow(ax, (4.6, y + 0.6), (4.6, y + 0.25))
    for i, name in enumerate(OUTPUTS):
        y = 4.4 - i * 0.75
        _box(ax, 8.7, y, 1.9, 0.5, name, TOPIC)
    _arrow(ax, (6.05, 2.7), (7.75, 4.4))          # invalidate -> announcements
    _arrow(ax, (6.05, 1.85), (7.75, 3.65))        # recompile -> new plans and their receipts
    _arrow(ax, (6.05, 1.85), (7.75, 2.9))
    _arrow(ax, (6.05, 4.4), (7.75, 2.15))         # apply -> rejected input
    ax.text(6.95, 2.5, "rejected\ninput", fontsize=8, color="#444444", ha="center")
    _box(ax, 4.6, 0.65, 2.9, 0.6, "query: the cached plan if still valid,\nelse compile (budgeted selection)", HTTP,
         8.5)
    _arrow(ax, (4.6, 1.6), (4.6, 0.95))
    ax.text(4.68, 1.22, "reads state", fontsize=8, color="#444444")
    _box(ax, 1.2, 0.65, 1.9, 0.6, "POST /v1/select\nGET /v1/plans/{id}", HTTP, 8.5)
    _arrow(ax, (2.15, 0.65), (3.15, 0.65), "callers")
    _box(ax, 8.7, 0.65, 1.9, 0.6, "caches and gateways\nfollow both topics", HTTP, 8.5)
    ax.annotate("", xy=(8.7, 0.95), xytext=(9.75, 4.4), arrowprops={"arrowstyle": "->", "color": "#444444",
                                                                      "lw": 1.2, "connectionstyle": "arc3,rad=-0.3"})
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("flow.png"))
