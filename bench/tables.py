"""Markdown tables and figures as the bench summaries print them."""

from __future__ import annotations


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("n/a" if v is None else str(v) for v in row) + " |" for row in rows]
    return out + [""]


def _each(values, suffix: str = "") -> str:
    return " / ".join("n/a" if v is None else f"{v}{suffix}" for v in values)


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def _yes(flag) -> str:
    return "n/a" if flag is None else ("yes" if flag else "no")
