"""CLI commands that call a running worker over HTTP: select, plan, status."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from agents.cli.settings import _run_info, _settings


def _http(args: argparse.Namespace) -> str:
    settings = _settings(args)
    return (args.url or _run_info(settings).get("http")
            or f"http://{settings.web_host}:{settings.web_port}").rstrip("/")


def _headers(args: argparse.Namespace) -> dict[str, str]:
    """JSON, and the bearer secret from FRESHPLAN_TOKEN or the local run's run.json."""
    settings = _settings(args)
    token = settings.token or _run_info(settings).get("token")
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _request(method: str, url: str, body: dict | None, headers: dict[str, str],
             timeout: float = 60) -> tuple[int, dict | None]:
    """(exit code, response document): 0 with the body, 1 after printing an HTTP error, 2 unreachable."""
    data = orjson.dumps(body) if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return 0, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        print(json.dumps(json.loads(exc.read() or b"{}"), indent=2), file=sys.stderr)
        return 1, None
    except urllib.error.URLError as exc:
        print(f"freshplan: cannot reach {url}: {exc.reason}; is `freshplan run` up?", file=sys.stderr)
        return 2, None


def _call(method: str, url: str, body: dict | None, headers: dict[str, str]) -> int:
    code, doc = _request(method, url, body, headers)
    if code == 0:
        print(json.dumps(doc, indent=2))
    return code


def cmd_select(args: argparse.Namespace) -> int:
    """POST a decision request built from a JSON file and/or flags; print the plan."""
    body: dict = json.loads(Path(args.file).read_text()) if args.file else {}
    for name in ("decision_type", "principal", "purpose", "entity", "decision_time", "query",
                 "at_least_as_fresh"):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    budget = dict(body.get("budget") or {})
    for name in ("tokens", "calls"):
        if getattr(args, name) is not None:
            budget[name] = getattr(args, name)
    if budget:
        body["budget"] = budget
    return _call("POST", _http(args) + "/v1/select", body, _headers(args))


def cmd_status(args: argparse.Namespace) -> int:
    """Print lag, revocation state, plans, index size and the last event per topic of a running worker."""
    code, health = _request("GET", _http(args) + "/healthz", None, _headers(args), timeout=30)
    if code:
        return code
    if args.json:
        print(json.dumps(health, indent=2))
        return 0
    if "revocations" not in health:
        print("freshplan status: the worker is alive, but this caller lacks the `status` scope for details; "
              "set FRESHPLAN_TOKEN to a secret that has it.", file=sys.stderr)
        return 1
    rev = health["revocations"]
    print(f"now (event time)   {health['now']}")
    print(f"revocations        {rev['state']} (lag {rev['lag_events']} events, {rev['seconds_behind']}s; "
          f"bound {rev['bound_seconds']}s)")
    print(f"plans              {', '.join(f'{k} {v}' for k, v in sorted(health['plans'].items())) or 'none'}")
    print(f"index edges        {health['index_edges']}    outbox {health['outbox']}")
    _print_shard(health.get("shard"))
    for topic in ("source-changes", "policy-versions", "revocations", "clock"):
        lag = sum(health.get("lag", {}).get(topic, {}).values())
        last = health.get("last_events", {}).get(topic)
        seen = f"last {last['event_id']} at {last['applied_at']}" if last else "no events applied yet"
        print(f"{topic:<18} lag {lag:<6} {seen}")
    return 0


def _print_shard(shard: dict | None) -> None:
    """This worker's entity shard, and which worker the group gave each entity partition."""
    if not shard:
        return
    held = shard["partitions"].get("plans", [])
    restoring = ", ".join(map(str, shard["restoring"])) or "none"
    print(f"shard              entity partitions {held or 'none'}: {shard['resources']} resources about "
          f"{shard['entities']} entities, {shard['plans']} plans; restoring {restoring}")
    members: dict[str, list[int]] = {}
    for partition, url in sorted((shard.get("owners") or {}).items(), key=lambda kv: int(kv[0])):
        members.setdefault(url or "(unassigned)", []).append(int(partition))
    for url, partitions in sorted(members.items()):
        print(f"  worker {url:<30} partitions {partitions}")


def cmd_plan(args: argparse.Namespace) -> int:
    """Print whether a plan is fresh or invalidated, and why."""
    return _call("GET", f"{_http(args)}/v1/plans/{args.plan_id}", None, _headers(args))
