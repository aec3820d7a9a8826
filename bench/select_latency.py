"""Select latency on a generated catalog: compile path and cache path against plain DuckDB BM25 top-k.

Run: .venv/bin/python bench/select_latency.py [--resources 100000] [--principals 1000] [--types 20]
     [--requests 300]
Builds a DuckDB state with the project's own catalog code, then in one run times, for the same
requests: the compile path (cache miss), the cache path (the same request again) and a plain
BM25 top-10 over the same resources in plain DuckDB SQL (a term table built once from their content).
Reports p50/p95/p99 in milliseconds and the ratios to plain top-k.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.plans.plan_writer import PlanWriter  # noqa: E402
from agents.web.query import QueryService  # noqa: E402
from compiler.policy import compile_policy  # noqa: E402
from schemas.codec import contract_from  # noqa: E402
from schemas.records import Entity, PolicyBundle, Principal, Resource, SourceChange  # noqa: E402
from state.local_state import LocalState  # noqa: E402

WORDS = ("facility limit waiver covenant review policy screening approval delegation invoice "
         "supplier payment breach renewal committee overdraft collateral rating exposure audit").split()
CEDAR = ('permit(principal, action == Action::"use", resource) when { resource has allowed_roles && '
         'resource.allowed_roles.containsAny(principal.roles) && resource.allowed_purposes.contains(context.purpose) };'
         '\nforbid(principal, action == Action::"use", resource) when { resource.sensitivity == "restricted" && '
         '!principal.roles.contains("investigator") };')


# Tokens as DuckDB's FTS extension makes them by default (lower case, accents stripped, split at
# anything but a-z, English stop words dropped), without its Porter stemmer, which core DuckDB lacks.
STOPWORDS = ("a an and are as at be but by for from has have he her his if in into is it its no not of on or "
             "she so such that the their then there these they this to was were which will with").split()
BM25_K1, BM25_B = 1.2, 0.75
BM25_TABLES = f"""
CREATE TEMP MACRO bm25_tokens(text) AS list_filter(
  string_split_regex(regexp_replace(lower(strip_accents(text)), '[^a-z]+', ' ', 'g'), ' '),
  lambda w: w <> '' AND NOT list_contains({STOPWORDS!r}, w));
CREATE TEMP TABLE bm25_terms AS
  SELECT id, term, count(*) AS tf FROM (SELECT id, unnest(bm25_tokens(content)) AS term FROM resources) GROUP BY ALL;
CREATE TEMP TABLE bm25_docs AS
  SELECT id, len(bm25_tokens(content)) AS len FROM resources;
CREATE TEMP TABLE bm25_dict AS SELECT term, count(*) AS df FROM bm25_terms GROUP BY term;
CREATE TEMP TABLE bm25_stats AS SELECT count(*) AS num_docs, avg(len) AS avgdl FROM bm25_docs;
"""
# Okapi BM25 with idf = ln((N - df + 0.5) / (df + 0.5) + 1). The FTS extension's match_bm25 took log10: on
# this bench's content its top-10 was the same, each score ln(10) times smaller.
BM25_TOP10 = f"""
WITH q AS (SELECT DISTINCT unnest(bm25_tokens(?)) AS term),
scores AS (
  SELECT t.id, sum(ln((s.num_docs - d.df + 0.5) / (d.df + 0.5) + 1)
                   * t.tf * ({BM25_K1} + 1) / (t.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * l.len / s.avgdl))) AS score
  FROM q JOIN bm25_dict d USING (term) JOIN bm25_terms t USING (term) JOIN bm25_docs l USING (id), bm25_stats s
  GROUP BY t.id)
SELECT r.id, r.content, scores.score FROM scores JOIN resources r USING (id) ORDER BY scores.score DESC LIMIT 10
"""


def build(state: LocalState, n_resources: int, n_principals: int, n_types: int, rng: random.Random):
    classes = [f"class_{i}" for i in range(40)]
    types = {}
    for t in range(n_types):
        props = [{"id": f"p{t}_{k}", "accepted_classes": rng.sample(classes, 2), "min_independent": 1}
                 for k in range(4)]
        types[f"decision.{t}"] = {"purposes": [f"purpose_{t % 5}"], "propositions": props}
    contracts = tuple(contract_from(name, body) for name, body in types.items())
    bundle = PolicyBundle("bench", 1, datetime(2026, 1, 1, tzinfo=timezone.utc), CEDAR, contracts)
    n_entities = max(1, n_resources // 50)
    with state.store.transaction():
        state.catalog.apply_policy(bundle)
        for i in range(n_entities):
            state.catalog.apply_source_change(SourceChange("entity", "upsert", f"E{i}", Entity(f"E{i}")))
        for i in range(n_principals):
            roles = tuple(rng.sample(["analyst", "manager", "investigator", "clerk"], 2))
            state.catalog.apply_source_change(SourceChange("principal", "upsert", f"u{i}", Principal(f"u{i}", roles)))
        batch = []
        for i in range(n_resources):
            t = rng.choice(list(types.values()))
            prop = rng.choice(t["propositions"])
            cls = rng.choice(prop["accepted_classes"] + [rng.choice(classes)])
            batch.append(SourceChange("resource", "upsert", f"r{i}", Resource(
                id=f"r{i}", version=1, entity=f"E{i % n_entities}", evidence_class=cls, tokens=rng.randint(50, 400),
                content=" ".join(rng.choices(WORDS, k=30)), supports=(prop["id"],),
                valid_from=datetime(2025, 1, 1, tzinfo=timezone.utc), provenance_group=f"g{rng.randint(0, 9)}",
                sensitivity="restricted" if rng.random() < 0.05 else "internal",
                attributes={"allowed_roles": rng.sample(["analyst", "manager", "investigator", "clerk"], 2),
                            "allowed_purposes": [f"purpose_{k}" for k in range(5)]})))
            if len(batch) == 5000:
                state.catalog.apply_resources(batch)
                batch = []
        state.catalog.apply_resources(batch)
    compile_policy(bundle)
    return types, n_entities


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "mean": statistics.fmean(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=100_000)
    parser.add_argument("--principals", type=int, default=1_000)
    parser.add_argument("--types", type=int, default=20)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    state = LocalState.open(Path(tempfile.mkdtemp(prefix="fp-select-")) / "f.duckdb")
    started = time.perf_counter()
    types, n_entities = build(state, args.resources, args.principals, args.types, rng)
    print(f"built {args.resources:,} resources, {args.principals:,} principals, {args.types} decision types, "
          f"{n_entities:,} entities in {time.perf_counter() - started:.1f}s", flush=True)
    db = state.store.db
    started = time.perf_counter()
    db.execute(BM25_TABLES)
    print(f"BM25 term table built in {time.perf_counter() - started:.1f}s", flush=True)
    query = QueryService(state, PlanWriter(state, lambda name: name))
    names = list(types)
    requests = []
    for _ in range(args.requests):
        name = rng.choice(names)
        requests.append({"decision_type": name, "principal": f"u{rng.randrange(args.principals)}",
                         "purpose": types[name]["purposes"][0], "entity": f"E{rng.randrange(n_entities)}",
                         "decision_time": "2026-08-30T00:00:00Z", "query": " ".join(rng.choices(WORDS, k=4)),
                         "budget": {"tokens": 1200}})
    compile_ms, cache_ms, topk_ms = [], [], []
    for i, body in enumerate(requests, start=1):
        t = time.perf_counter()
        plan = query.select(body)
        compile_ms.append((time.perf_counter() - t) * 1000)
        assert plan["served_from"] == "compiled"
        t = time.perf_counter()
        again = query.select(body)
        cache_ms.append((time.perf_counter() - t) * 1000)
        assert again["served_from"] == "cache" and again["plan_id"] == plan["plan_id"]
        t = time.perf_counter()
        db.execute(BM25_TOP10, [body["query"]]).fetchall()
        topk_ms.append((time.perf_counter() - t) * 1000)
        if i % 100 == 0:
            print(f"  {i}/{len(requests)} requests", flush=True)
    report = {"compile": percentiles(compile_ms), "cache": percentiles(cache_ms), "bm25_top10": percentiles(topk_ms)}
    print(f"{'path':<12}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'mean ms':>10}{'p99 / top-k':>14}")
    for name, row in report.items():
        ratio = row["p99"] / report["bm25_top10"]["p99"]
        print(f"{name:<12}{row['p50']:>10.2f}{row['p95']:>10.2f}{row['p99']:>10.2f}{row['mean']:>10.2f}{ratio:>14.2f}")
    print(f"targets: compile p99 <= 50 ms: {'met' if report['compile']['p99'] <= 50 else 'MISSED'}; "
          f"cache p99 <= 5 ms: {'met' if report['cache']['p99'] <= 5 else 'MISSED'}")
    state.close()


if __name__ == "__main__":
    main()
