"""JSON log lines carry ids and reason codes as fields."""

from __future__ import annotations

import asyncio
import gc
import io
import logging

import orjson
import pytest

from agents.ops.logs import CHATTY, JsonLines, configure


def test_json_lines_carry_extra_fields_and_no_surprises():
    record = logging.LogRecord("agents.stream.invalidation", logging.INFO, __file__, 1, "invalidated plan %s (%s)",
                               ("plan-1", "scope_changed"), None)
    record.plan_id, record.reason, record.event_id = "plan-1", "scope_changed", "e-17"
    doc = orjson.loads(JsonLines().format(record))
    assert doc["msg"] == "invalidated plan plan-1 (scope_changed)" and doc["level"] == "info"
    assert (doc["plan_id"], doc["reason"], doc["event_id"]) == ("plan-1", "scope_changed", "e-17")
    assert doc["ts"].endswith("Z") and "args" not in doc


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def restored_logging():
    # What earlier tests of this process left for the collector (a task destroyed pending logs an error) is
    # collected now, into their handlers, not into the stream a test here reads.
    gc.collect()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in CHATTY})
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("tty, expected", [(True, "text"), (False, "json")])
def test_auto_is_text_on_a_terminal_and_json_elsewhere_without_library_chatter(restored_logging, tty, expected):
    stream = _Stream(tty)
    assert configure("info", "auto", stream) == expected
    logging.getLogger("faust.worker").info("[^Worker]: Starting...")
    logging.getLogger("aiokafka").warning("Unable to connect")
    logging.getLogger("agents.plans.ownership").info("owning plan partitions %s", [0, 1])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "Starting" not in stream.getvalue()
    if expected == "json":
        assert [orjson.loads(line)["msg"] for line in lines] == ["Unable to connect",
                                                                 "owning plan partitions [0, 1]"]
    else:
        assert lines[1].endswith("INFO    owning plan partitions [0, 1]") and "{" not in lines[1]


@pytest.mark.parametrize("tty", [True, False])
def test_start_up_narration_is_left_to_the_ready_block_on_a_terminal_only(restored_logging, tty):
    stream = _Stream(tty)
    configure("info", "auto", stream)
    logging.getLogger("streams.broker").info("embedded broker ready at %s", "127.0.0.1:9092")
    logging.getLogger("agents.stream.replica").info("replica applying %d input partitions", 8)
    logging.getLogger("agents.stream.replica").warning("input topics were reset")
    lines = stream.getvalue().splitlines()
    if tty:
        assert len(lines) == 1 and lines[0].endswith("WARNING input topics were reset")
    else:
        assert [orjson.loads(line)["msg"] for line in lines] == [
            "embedded broker ready at 127.0.0.1:9092", "replica applying 8 input partitions", "input topics were reset"]


def test_debug_keeps_the_libraries_lines(restored_logging):
    stream = _Stream(False)
    configure("debug", "json", stream)
    logging.getLogger("faust.worker").info("[^Worker]: Starting...")
    assert "Starting" in stream.getvalue()


async def test_a_worker_logs_json_lines_and_little_before_it_is_ready(worker):
    # The fixture starts `freshplan run` with default log settings, its output going to a file.
    for _ in range(300):  # HTTP can answer a moment before the ready line is printed
        lines = worker.log_path.read_text().splitlines()
        ready = next((i for i, line in enumerate(lines) if line.startswith("freshplan: ready:")), None)
        if ready is not None:
            break
        await asyncio.sleep(0.1)
    assert ready is not None, lines
    before = lines[:ready]
    assert all(isinstance(orjson.loads(line), dict) for line in before), before
    assert len(before) <= 8, before  # was 53, nearly all Faust and mode narrating their services
