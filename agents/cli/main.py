"""The `freshplan` command: run a worker, load scenarios, select plans, inspect plans."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path


from agents.cli.cdc import add_parser as add_cdc_parser
from agents.cli.client import cmd_plan, cmd_select, cmd_status
from agents.cli.service import service_worker
from agents.cli.settings import _cdc_mapping, _run_info, _settings
from agents.cli.tokens import add_tokens_parser
from streams.settings import Settings, SettingsError

log = logging.getLogger("freshplan")

DESCRIPTION = """freshplan keeps LLM context plans fresh: it watches source changes, policy
versions, revocations and clock ticks on Kafka, invalidates exactly the plans that depend on
them, recompiles them, and serves budgeted selections over HTTP.

Settings come from FRESHPLAN_* environment variables (see docs/settings.md) and the flags below.
Without KAFKA_BOOTSTRAP_SERVERS, `run` starts an embedded Kafka-protocol broker (Tansu)."""


def cmd_run(args: argparse.Namespace) -> int:
    """Start the embedded broker if needed, then the worker and its HTTP API, until stopped."""
    from agents.web.access import AccessError, load_access, write_run_file
    from agents.cli.ready import Ready, loaded_line, ready_text, request_file
    from agents.cli.loader import load_file
    from agents.ops.logs import configure as configure_logging
    from agents.worker import build_worker
    from agents.stream.writer import SWITCH_INTERVAL_SECONDS
    from streams.admin import ensure_topics
    from streams.broker import EmbeddedBroker
    from schemas.cdc_mapping import MappingError
    from streams.kafka_security import KafkaSecurityError

    settings = _settings(args)
    terminal = configure_logging(settings.log_level, settings.log_format) == "text"
    try:
        settings.kafka.validate()
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        access = load_access(settings)
        cdc = _cdc_mapping(settings)
    except (AccessError, KafkaSecurityError, MappingError) as exc:
        print(f"freshplan run: {exc}", file=sys.stderr, flush=True)
        return 2
    kept = {"token": access.local_token} if access.local_token else {}  # the secret survives restarts
    if (refusal := _unusable_state(settings)) is not None:
        print(refusal, file=sys.stderr, flush=True)
        return 3
    broker = worker = None
    bootstrap = settings.bootstrap_servers
    if not bootstrap:
        # Its port is picked before the worker binds its own: it must not be one of them.
        broker = EmbeddedBroker(avoid=frozenset({settings.web_port, settings.metrics_port or 0})).start()
        bootstrap = broker.bootstrap_servers
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(ensure_topics(settings, bootstrap))
        for path in args.load or ():
            count, token = load_file(settings, bootstrap, Path(path))
            print(loaded_line(count, path, token, terminal), flush=True)
        http = f"http://{settings.web_host}:{settings.web_port}"
        run_info = dict(kept, bootstrap_servers=bootstrap, http=http, topic_prefix=settings.topic_prefix,
                        pid=os.getpid())
        # See agents.stream.writer: the loop and the writer share the GIL.
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        worker = build_worker(settings, bootstrap, access, cdc)
        ready = Ready(bootstrap, broker is not None, http, settings.db_path, settings.run_file,
                      bool(access.local_token), settings.callers_file, settings.state_dir,
                      settings.state_dir == Settings().state_dir, request_file(args.load or []))
        service_class = service_worker(worker, settings, broker, run_info, ready_text(ready, terminal))
        service = service_class(worker.app, loglevel=settings.log_level, loop=loop, override_logging=False,
                                quiet=True)
        service.spinner = None  # Faust draws one even when quiet; the ready line says what it would
        service.execute_from_commandline()
    except SystemExit:
        pass
    finally:
        if kept:
            write_run_file(settings.run_file, kept)
        else:
            settings.run_file.unlink(missing_ok=True)
        if worker is not None:
            worker.close()
        if broker is not None:
            broker.stop()
    return 0


def _unusable_state(settings: Settings) -> str | None:
    """Why the state file must not be used (damaged, truncated, held by another process), or None."""
    from state.integrity import check

    problem = check(settings.db_path)
    if problem is None:
        return None
    db = settings.db_path
    if problem.startswith("another process"):
        return f"freshplan run: cannot use the state file {db}: {problem}. Stop the other worker first."
    return (f"freshplan run: the state file {db} cannot be used: {problem}. Nothing was started. Move it aside "
            f"(mv {db} {db}.damaged, and its .wal file if there is one) and rebuild it from the topics with "
            "`freshplan replay` (KAFKA_BOOTSTRAP_SERVERS set; replay moves the file aside itself), or, with the "
            "embedded broker, start on an empty --state-dir and load your scenarios again.")


def _progress_bar():
    """A rich progress bar on a terminal; None (quiet) otherwise."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not sys.stderr.isatty():
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True)


def cmd_replay(args: argparse.Namespace) -> int:
    """Rebuild local state from the topics (worker stopped): the old DuckDB file is kept aside."""
    from agents.ops.logs import configure as configure_logging
    from agents.cli.replay import replay
    from schemas.cdc_mapping import MappingError

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    try:
        cdc = _cdc_mapping(settings)
    except MappingError as exc:
        print(f"freshplan replay: {exc}", file=sys.stderr)
        return 2
    info = _run_info(settings)
    if info.get("pid") and _alive(info["pid"]):
        print(f"freshplan replay: a worker (pid {info['pid']}) is using {settings.state_dir}; stop it first.",
              file=sys.stderr)
        return 2
    bootstrap = settings.bootstrap_servers or args.bootstrap
    if not bootstrap:
        print("freshplan replay: set KAFKA_BOOTSTRAP_SERVERS (or --bootstrap) to the cluster holding the topics.",
              file=sys.stderr)
        return 2
    bar = _progress_bar()
    tasks: dict[str, int] = {}

    def progress(topic: str, seen: int, total: int) -> None:
        if bar is None:
            return
        if topic not in tasks:
            tasks[topic] = bar.add_task(topic, total=total)
        bar.update(tasks[topic], completed=seen)

    if bar:
        bar.start()
    try:
        summary = asyncio.run(replay(settings, bootstrap, progress, cdc))
    finally:
        if bar:
            bar.stop()
    print(json.dumps(summary))
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def cmd_load(args: argparse.Namespace) -> int:
    """Publish scenario files to the configured or locally running broker."""
    from agents.cli.loader import ScenarioError, load_file

    settings = _settings(args)
    bootstrap = settings.bootstrap_servers or _run_info(settings).get("bootstrap_servers")
    if not bootstrap:
        print("freshplan load: no broker: set KAFKA_BOOTSTRAP_SERVERS or start `freshplan run` "
              f"with the same --state-dir (looked for {settings.run_file}).", file=sys.stderr)
        return 2
    asyncio.set_event_loop(asyncio.new_event_loop())
    bar = _progress_bar()
    for path in args.files:
        task = bar.add_task(f"publishing {path}", total=None) if bar else None
        if bar:
            bar.start()
        try:
            count, token = load_file(settings, bootstrap, Path(path), progress=(
                (lambda done, total, task=task: bar.update(task, completed=done, total=total)) if bar else None))
        except (ScenarioError, OSError) as exc:
            print(f"freshplan load: {exc}", file=sys.stderr)
            return 2
        finally:
            if bar:
                bar.stop()
        print(json.dumps({"file": path, "events": count, "freshness_token": token}))
    return 0


def cmd_schemas_export(args: argparse.Namespace) -> int:
    """Write the JSON Schema of every topic, and of the CDC mapping file, into DIR (for other languages)."""
    from schemas.cdc_mapping import mapping_schema
    from schemas.codec import TOPICS, schema_text

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("_common",) + TOPICS:
        (out / f"{name}.schema.json").write_text(schema_text(name), encoding="utf-8")
    (out / "cdc-mapping.schema.json").write_text(json.dumps(mapping_schema(), indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"dir": str(out), "schemas": len(TOPICS) + 2}))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run every benchmark against its baselines in one run on the embedded broker.

    Writes bench/results/<date>.json (everything), <date>-quality.json (replayable selection
    quality), <date>.md (summary with targets met or missed), <date>-profile.txt and PNG plots.
    A full run takes about 15 minutes on two cores (13 on 2026-12-05); --quick takes a minute or two.
    """
    from bench.suite import BenchOptions, run  # bench sits above agents; loaded only for this command

    options = BenchOptions.quick() if args.quick else BenchOptions()
    changes = {k: v for k, v in {"events": args.events, "fanout_plans": args.fanout_plans,
                                 "restart_plans": args.restart_plans, "seed": args.seed}.items() if v is not None}
    if args.rates:
        changes["rates"] = tuple(int(r) for r in args.rates.split(","))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None
    if bootstrap:  # the service's timeout there, not the embedded broker's 4 s (Apache Kafka refuses under 6 s)
        changes["session_timeout"] = Settings.from_env().session_timeout
    options = replace(options, **changes)
    result = run(options, Path(args.out), bootstrap=bootstrap)
    for target in result["targets"]:
        print(f"{'met   ' if target['met'] else 'MISSED'}  {target['measure']}: {target['shown']} "
              f"(target {target['target']}){'; ' + target['gap'] if target['gap'] else ''}")
    return 0


def cmd_chaos(args: argparse.Namespace) -> int:
    """Start an embedded broker and a worker per fault (broker reset, oversized plan, id collision, poisoned
    `plans`, paused policies, hostile requests, clock jump, read load, withheld cause, revocation order,
    forged tokens), inflict it, and print a table: fault, expected, observed, held. Exits 1 if any
    promise broke."""
    from bench.chaos import main as chaos_main

    return chaos_main(Path(args.out) if args.out else None, args.only)


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    top = argparse.ArgumentParser(prog="freshplan", description=DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True)

    _add_run(sub)
    _add_client_commands(sub)
    _add_operator_commands(sub)
    add_cdc_parser(sub)
    return top


def _add_run(sub) -> None:
    """`freshplan run`."""
    run = sub.add_parser("run", help="start the worker and HTTP API (embedded broker when needed)",
                         description=cmd_run.__doc__)
    run.add_argument("--host", help="HTTP interface to bind (default 127.0.0.1, FRESHPLAN_WEB_HOST)")
    run.add_argument("--port", type=int, help="HTTP port (default 6066, FRESHPLAN_WEB_PORT)")
    run.add_argument("--state-dir", help="directory for DuckDB state (default .freshplan, FRESHPLAN_STATE_DIR)")
    run.add_argument("--partitions", type=int, help="partitions per topic when creating topics (default 4)")
    run.add_argument("--load", action="append", metavar="FILE.jsonl",
                     help="publish this scenario before starting (repeatable)")
    run.add_argument("--no-wall-clock", action="store_true",
                     help="do not publish clock ticks from wall time (a clock producer does)")
    run.add_argument("--rebase", action="store_true",
                     help="accept input topics that were reset (new broker, recreated topics): keep the catalog "
                          "and plans and re-read the topics from their start (the embedded broker always does)")
    run.set_defaults(func=cmd_run)


def _add_client_commands(sub) -> None:
    """What a client of a running service runs: load, select, status, plan."""
    load = sub.add_parser("load", help="publish scenario files (JSON lines of {topic, event})",
                          description=cmd_load.__doc__)
    load.add_argument("files", nargs="+", metavar="FILE.jsonl")
    load.add_argument("--state-dir", help="state dir of the local `freshplan run` whose broker to use")
    load.set_defaults(func=cmd_load)

    select = sub.add_parser("select", help="ask for a fresh plan and print it", description=cmd_select.__doc__)
    select.add_argument("--file", help="JSON file with the request body")
    select.add_argument("--decision-type", dest="decision_type")
    select.add_argument("--principal")
    select.add_argument("--purpose")
    select.add_argument("--entity", help="entity id or alias")
    select.add_argument("--decision-time", dest="decision_time", help="RFC 3339; omit for a live decision")
    select.add_argument("--query", help="free text used only for ranking")
    select.add_argument("--tokens", type=int, help="token budget")
    select.add_argument("--calls", type=int, help="retrieval call budget")
    select.add_argument("--at-least-as-fresh", dest="at_least_as_fresh", metavar="TOKEN",
                        help="answer only from state at least this fresh")
    select.add_argument("--url", help="service URL (default: the local run's, else http://127.0.0.1:6066)")
    select.add_argument("--state-dir", help="state dir of the local `freshplan run`")
    select.set_defaults(func=cmd_select)

    status = sub.add_parser("status", help="lag, revocations, plans, index size, last event per topic",
                            description=cmd_status.__doc__)
    status.add_argument("--json", action="store_true", help="print the raw /healthz document")
    status.add_argument("--url")
    status.add_argument("--state-dir")
    status.set_defaults(func=cmd_status)

    plan = sub.add_parser("plan", help="show whether a plan is fresh or invalidated, and why",
                          description=cmd_plan.__doc__)
    plan.add_argument("plan_id")
    plan.add_argument("--url")
    plan.add_argument("--state-dir")
    plan.set_defaults(func=cmd_plan)


def _add_operator_commands(sub) -> None:
    """What an operator runs beside the service: replay, bench, tokens, chaos, schemas."""
    rebuild = sub.add_parser("replay", help="rebuild local state from the topics (worker stopped)",
                             description=cmd_replay.__doc__)
    rebuild.add_argument("--state-dir", help="state dir of the worker to rebuild")
    rebuild.add_argument("--bootstrap", help="Kafka bootstrap servers (else KAFKA_BOOTSTRAP_SERVERS)")
    rebuild.set_defaults(func=cmd_replay)

    bench = sub.add_parser("bench", help="benchmarks against baselines, side by side in one run",
                           description=cmd_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--quick", action="store_true", help="small sizes (a smoke run, a minute or two)")
    bench.add_argument("--out", default="bench/results", help="directory for results (default bench/results)")
    bench.add_argument("--events", type=int, help="change events in the throughput comparison (default 20000)")
    bench.add_argument("--rates", help="fixed input rates for latency, comma-separated (default 100,1000,5000)")
    bench.add_argument("--fanout-plans", dest="fanout_plans", type=int, help="plans in the fan-out (default 100000)")
    bench.add_argument("--restart-plans", dest="restart_plans", type=int,
                       help="plans in the restart measurement (default 1000000)")
    bench.add_argument("--seed", type=int, help="workload seed (default 7)")
    bench.set_defaults(func=cmd_bench)
    add_tokens_parser(sub)
    chaos = sub.add_parser("chaos", help="run the fault catalogue against live workers and print what held",
                           description=cmd_chaos.__doc__)
    chaos.add_argument("--out", help="also write the outcomes as JSON to this file")
    chaos.add_argument("--only", action="append", metavar="FAULT",
                       help="run only this fault (repeatable): reset_broker, oversized_plan, id_collision, "
                            "poisoned_plans, paused_policies, hostile_requests, clock_jump, read_load, withheld_cause, "
                            "revocation_order, forged_token")
    chaos.set_defaults(func=cmd_chaos)
    schemas = sub.add_parser("schemas", help="wire contracts: JSON Schemas per topic")
    schemas_sub = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schemas_sub.add_parser("export", help="write every topic's JSON Schema into DIR",
                                    description=cmd_schemas_export.__doc__)
    export.add_argument("dir", metavar="DIR")
    export.set_defaults(func=cmd_schemas_export)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `freshplan` console script."""
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as exc:  # a FRESHPLAN_* value it cannot use: the message names it, no traceback
        print(f"freshplan: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
