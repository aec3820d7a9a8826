"""Every kept version of every policy bundle, and which one governs a decision type at an instant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb
import orjson

from schemas.records import PolicyBundle


@dataclass(frozen=True)
class Governing:
    """The bundle version that governs a decision type at some instant."""

    bundle_id: str
    """Bundle id."""
    version: int
    """Bundle version."""
    effective_at: datetime
    """When this version took (or takes) effect."""
    body: str
    """The decision type's contract in this version, as stored (JSON)."""
    superseded_at: datetime | None
    """When a later version of the bundle takes over (None: none is kept)."""


def keep_version(db: duckdb.DuckDBPyConnection, bundle: PolicyBundle, contracts: dict[str, dict]) -> None:
    """Store one bundle version with its contracts (wire shapes by decision type), source rules and trust."""
    db.execute("INSERT INTO policy_versions VALUES (?, ?, ?, ?, ?, ?)",
               [bundle.bundle_id, bundle.version, bundle.effective_at, bundle.cedar,
                orjson.dumps({group: list(classes) for group, classes in bundle.sources.items()}).decode(),
                bundle.source_trust])
    for decision_type, body in contracts.items():
        db.execute("INSERT INTO contract_versions VALUES (?, ?, ?, ?)",
                   [bundle.bundle_id, bundle.version, decision_type, orjson.dumps(body).decode()])


def versions_of(db: duckdb.DuckDBPyConnection, decision_type: str) -> list[tuple]:
    """(bundle, version, effective_at, contract body or None) of each version of every bundle that ever defined it."""
    return db.execute(
        "SELECT v.bundle_id, v.version, v.effective_at, c.body FROM policy_versions v "
        "LEFT JOIN contract_versions c ON c.bundle_id = v.bundle_id AND c.version = v.version "
        "AND c.decision_type = ? WHERE v.bundle_id IN (SELECT bundle_id FROM contract_versions "
        "WHERE decision_type = ?) ORDER BY v.bundle_id, v.version", [decision_type, decision_type]).fetchall()


def governing(rows: list[tuple], at: datetime | None) -> Governing | None:
    """The version governing a decision type at `at`, from the rows `versions_of` read.

    A bundle's version in effect at t is its highest whose effective_at <= t (`at` None: its
    highest), and it governs when it defines the type. When none does, the earliest future
    version that defines it is returned, for the compiler to refuse as not yet effective; None
    when no version defines it at t or later.
    """
    by_bundle: dict[str, list[tuple]] = {}
    for row in rows:
        by_bundle.setdefault(row[0], []).append(row)
    found = []
    for versions in by_bundle.values():
        current = [v for v in versions if at is None or v[2] <= at]
        if current and current[-1][3] is not None:
            later = [v[2] for v in versions if v[1] > current[-1][1]]
            found.append(Governing(*current[-1], min(later) if later else None))
    if found:
        # Two bundles define it only after one retired it and the other took it: the newer rules.
        return max(found, key=lambda g: (g.effective_at, g.bundle_id))
    future = sorted((v for v in rows if v[3] is not None and at is not None and v[2] > at),
                    key=lambda v: (v[2], v[0], v[1]))
    return Governing(*future[0], None) if future else None
