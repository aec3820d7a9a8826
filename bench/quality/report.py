"""The 003 tables in Markdown: each corpus's contenders, the seed's own figures beside the first, and the losses."""

from __future__ import annotations

ROWS = (("Answer decision accuracy", "answer_decision_accuracy"), ("Accepted", "accepted"),
        ("Relevant micro recall", "relevant_micro_recall"), ("Relevant documents retrieved", "relevant_retrieved"),
        ("Answerable query recall", "answerable_query_recall"), ("Route accuracy", "route_accuracy"),
        ("ACL leakage queries", "acl_leakage_queries"), ("Abstentions", "abstentions"),
        ("Abstention precision", "abstention_precision"), ("Abstention recall", "abstention_recall"),
        ("Answer/abstain type accuracy", "answer_abstain_type_accuracy"),
        ("Mean retrieval steps", "mean_retrieval_steps"), ("Max retrieval steps", "max_retrieval_steps"),
        ("Mean latency work units", "mean_latency_work_units"),
        ("Total latency work units", "total_latency_work_units"), ("Total cost units", "total_cost_units"),
        ("Unit accepted cost", "unit_accepted_cost"))
# Why the adaptive controller fails each kind of query: what the compiler does and does not judge.
WHY = {
    "false-answer": "the evidence shares enough of the question's words (BM25 over the threshold, half its "
                    "terms covered) but does not state what was asked: lexical relevance is not entailment",
    "answer-content-mismatch": "one document closes the contract's single proposition, so a question needing "
                               "two documents gets one",
    "false-abstain": "the answer was in the tenant's documents, but no retrieved document covered half of "
                     "the question's terms above the threshold, and no rewrite rule bridged the wording",
    "acl-leakage": "a document of another tenant, or a count of them, reached a channel the caller reads",
}


def _cell(value) -> str:
    return "n/a" if value is None else str(value)


def _table(part: dict, seed: dict | None) -> list[str]:
    proto, ours = part["protocol"], part["metrics"]
    names = list(ours)
    extra = ["seed fixed one-shot", "seed adaptive stateful"] if seed else []
    lines = [f"### corpus `{proto['corpus']}` ({proto['documents']} documents, {proto['tenants']} tenants, "
             f"{proto['queries']} frozen queries of which {proto['expected_abstain']} must abstain)", "",
             "| metric | " + " | ".join(names + extra) + " |", "|---|" + "---|" * (len(names) + len(extra))]
    for label, key in ROWS:
        row = [_cell(ours[n].get(key)) for n in names] + ([_cell(seed[s].get(key)) for s in seed] if seed else [])
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    hard = [n for n in names if ours[n]["hard_failure"]]
    lines += ["", f"ACL leakage is a hard failure whatever the other figures: {', '.join(hard) or 'none'} "
              "failed it.", "", "Where the adaptive controller loses:", ""]
    by_kind: dict[str, list[str]] = {}
    for loss in part["losses"]:
        for kind in loss["failures"]:
            by_kind.setdefault(kind, []).append(loss["query"])
    for kind, ids in sorted(by_kind.items()):
        lines.append(f"- {kind} ({len(ids)}: {', '.join(ids)}): {WHY.get(kind, kind)}.")
    return lines + [""]


def markdown(quality: dict) -> list[str]:
    """Lines of the 003 section of the bench summary."""
    lines = ["## 003 evaluation", "",
             "fixed_one_shot and adaptive both run through the real compiler (one retrieval, or the catalogue's "
             "controller with its rewrite rules); each is charged the candidates it scored. The seed columns are "
             "the 003 seed's published figures on its own corpus, not re-run here. Replayable payload: `"
             + quality["file"] + f"`, sha256 (without capture time and environment) `{quality['payload_sha256']}`.",
             ""]
    lines += _table(quality, quality.get("seed_figures"))
    for part in (quality.get("corpora") or {}).values():
        lines += _table(part, None)
    return lines
