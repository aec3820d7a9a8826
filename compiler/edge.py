"""Numbers at the response edge: six significant digits out, exact arithmetic inside."""

from __future__ import annotations

import math
from typing import Any

SIGNIFICANT = 6
# Subtracting order-one quantities leaves residues near 1e-16 where the exact answer is 0;
# no quantity a plan reports is meaningful this close to zero.
NOISE_FLOOR = 1e-12


def tidy(value: float) -> float:
    """A float rounded to SIGNIFICANT digits; residues below NOISE_FLOOR become 0."""
    if not math.isfinite(value) or abs(value) < NOISE_FLOOR:
        return 0.0 if math.isfinite(value) else value
    return float(f"{value:.{SIGNIFICANT}g}") + 0.0


_PLAIN = frozenset({str, int, bool, type(None)})  # kept as they are: most leaves of a plan


def tidy_all(doc: Any) -> Any:
    """`doc` with every float inside it tidied (dicts, lists and tuples are rebuilt, the rest kept)."""
    # Exact types first: a plan has thousands of leaves, and a call per string costs as much as the walk.
    if type(doc) in _PLAIN:
        return doc
    if isinstance(doc, float):
        return tidy(doc)
    if isinstance(doc, dict):
        return {k: v if type(v) in _PLAIN else tidy_all(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [v if type(v) in _PLAIN else tidy_all(v) for v in doc]
    return doc
