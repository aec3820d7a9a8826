"""The fast input validators never accept what the published schemas refuse, and accept every good event."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import fastjsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.workload import generate
from schemas import codec
from schemas.codec import INPUT_TOPICS, decode, document, fast_validator, validator
from schemas.errors import InvalidEvent, SkippedEvent
from tests import events
from tests.cdc.test_fixtures import FIXTURES, MAPPING, fixture, message

ROOT = Path(__file__).resolve().parents[2]
# Values that sit on the schemas' edges: nulls, wrong types, bools posing as ints, length and range limits.
EDGES = [None, True, False, 0, -1, 1, 0.5, 1.5, 2**63 - 1, 2**63, "", "x", "P1D", "upsert", "delete",
         "resource", "principal", "entity", "spaceship", "2026-01-01T00:00:00Z", "a" * 9, "a" * 41, "a" * 513,
         [], [""], ["x"], ["x"] * 1001, {}, {"id": "x"}, {"id": ""},
         # where Rust's and Python's readings of the schema could part: whole floats as integers, 64-bit
         # limits, and regular expressions (`.` and `$` at line breaks, Unicode digits, astral characters)
         1.0, -0.0, 2**64 - 1, -2**63, "a:1\n", "\u2028:1", "x:\u0661", "P\n", "\U0001f600" * 40]
_DELETE = object()


def _objects(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def _fixture_documents() -> list[dict]:
    """Every JSON object in the test and scenario fixtures, Debezium fixtures also as the events they map to."""
    found: list[dict] = []
    for path in sorted([*ROOT.joinpath("tests").rglob("*.json*"), *ROOT.joinpath("scenarios").rglob("*.json*"),
                        *ROOT.joinpath("examples").rglob("*.json*")]):
        text = path.read_text("utf-8")
        lines = text.splitlines() if path.suffix == ".jsonl" else [text]
        for line in filter(str.strip, lines):
            found += _objects(json.loads(line))
    for name in sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem != "mapping"):
        key, value = message(fixture(name))
        try:
            found.append(document("source-changes", key, value, position="0:0", cdc=MAPPING))
        except (InvalidEvent, SkippedEvent):
            pass
    return found


def _generated_documents() -> list[dict]:
    work = generate(entities=10, principals=5, plans=20, changes=300, seed=7)
    built = [events.resource("r1"), events.principal("p1"), events.tick("2026-09-01T00:00:00Z"),
             events.revoke_role("p1", "analyst"), events.policy_version(2, "2026-01-01T00:00:00Z")]
    return [orjson.loads(value) for _, _, value in work.catalog + work.changes] + [doc for _, doc in built]


SEEDS = _fixture_documents() + _generated_documents()


def _outcome(check, doc) -> bool:
    try:
        check(doc)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def _verdict(topic, doc) -> bool:
    try:
        codec.validate(topic, doc)
    except InvalidEvent:
        return False
    return True


def _assert_same(doc, topics=INPUT_TOPICS, strict=False) -> None:
    """The fast check never accepts what the published schema refuses; what it refuses goes on to the published
    one, so the verdict is the published schema's (`strict`: it also accepts all the published one does)."""
    for topic in topics:
        published, fast = _outcome(validator(topic), doc), _outcome(fast_validator(topic), doc)
        assert fast <= published and (not strict or fast == published), (topic, doc)
        assert _verdict(topic, doc) == published, (topic, doc)


def _paths(node, prefix=()):
    """Every (container path, key) in a document: the places a mutation can hit."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield prefix, key
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node[:3]):
            yield prefix, index
            yield from _paths(value, prefix + (index,))


def _at(doc, where):
    for step in where:
        doc = doc[step]
    return doc


def _mutated(doc, where, key, value):
    out = copy.deepcopy(doc)
    parent = _at(out, where)
    if value is _DELETE:
        del parent[key]
    else:
        parent[key] = copy.deepcopy(value)
    return out


def _shapes(docs):
    """One document per distinct layout (paths and value types), so the exhaustive sweep stays small."""
    seen, picked = set(), []
    for doc in docs:
        layout = frozenset((where, key, type(_at(doc, where)[key]).__name__) for where, key in _paths(doc))
        if layout not in seen:
            seen.add(layout)
            picked.append(doc)
    return picked


def test_there_are_fixtures_of_every_input_topic_and_kind():
    topics = {topic for doc in SEEDS for topic in INPUT_TOPICS if _outcome(validator(topic), doc)}
    kinds = {doc["kind"] for doc in SEEDS if _outcome(validator("source-changes"), doc)}
    ops = {doc["op"] for doc in SEEDS if _outcome(validator("source-changes"), doc)}
    assert topics == set(INPUT_TOPICS) and kinds == {"resource", "principal", "entity"} and ops == {"upsert", "delete"}
    assert len(SEEDS) > 500


def test_every_fixture_gets_the_same_verdict():
    for doc in SEEDS:
        _assert_same(doc, strict=True)


def test_every_single_edit_of_every_layout_gets_the_same_verdict():
    for doc in _shapes(SEEDS):
        topics = [topic for topic in INPUT_TOPICS if _outcome(validator(topic), doc)]
        for where, key in list(_paths(doc)) if topics else ():
            for value in [_DELETE, *EDGES]:
                _assert_same(_mutated(doc, where, key, value), topics)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.one_of(st.sampled_from(EDGES), _json),
                                                  st.booleans()), min_size=1, max_size=4))
def test_random_edits_get_the_same_verdict(seed, edits):
    doc = copy.deepcopy(seed)
    for pick, value, delete in edits:
        places = list(_paths(doc))
        if not places:
            break
        where, key = places[pick % len(places)]
        doc = _mutated(doc, where, key, _DELETE if delete else value)
    _assert_same(doc)


def _decoded(topic, value):
    try:
        return decode(topic, None, value)
    except InvalidEvent as exc:
        return exc.error_class, exc.message
    except SkippedEvent as exc:
        return "skipped", str(exc)
    except TypeError as exc:  # schemas.debezium.is_debezium on an unhashable "op": raised before validation
        return "crash", str(exc)


def test_decode_gives_the_same_events_and_dead_letters_as_the_published_schema_alone(monkeypatch):
    values = [orjson.dumps(doc) for doc in SEEDS]
    for doc in _shapes(SEEDS)[:60]:
        values += [orjson.dumps(_mutated(doc, where, key, value))
                   for where, key in _paths(doc) for value in (_DELETE, None, 5, "x", [])]
    fast = [[_decoded(topic, value) for topic in INPUT_TOPICS] for value in values]
    monkeypatch.setattr(codec, "fast_validator", validator)
    assert fast == [[_decoded(topic, value) for topic in INPUT_TOPICS] for value in values]


def test_good_events_pass_the_fast_check_and_raise_nothing_inside_the_validator(monkeypatch):
    raised = []
    original = fastjsonschema.JsonSchemaValueException.__init__

    def counting(self, *args, **kwargs):
        raised.append(kwargs.get("rule"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(fastjsonschema.JsonSchemaValueException, "__init__", counting)
    good = [doc for doc in _generated_documents() if doc.get("kind") in (None, "principal", "entity")
            or doc.get("op") == "upsert"]
    nullable = events.resource("r2")[1]
    nullable["resource"].update(valid_to=None, observed_at=None, superseded_by=None, provenance_group=None)
    for doc in [*good, nullable]:
        topic = ("source-changes" if "kind" in doc else "clock" if "now" in doc else
                 "revocations" if "revoke" in doc else "policy-versions")
        assert _outcome(fast_validator(topic), doc), (topic, doc)  # never sent on to the slower check
        decode(topic, None, orjson.dumps(doc))
    assert raised == []


def test_rejections_keep_the_published_schemas_messages():
    doc = events.resource("r3")[1]
    doc["resource"]["valid_from"] = 5
    with pytest.raises(InvalidEvent) as bad:
        decode("source-changes", None, orjson.dumps(doc))
    assert bad.value.message == "source-changes event at resource/valid_from: breaks the schema's oneOf rule"
    doc = dict(events.principal("p9")[1], kind="resource")
    with pytest.raises(InvalidEvent) as bad:
        decode("source-changes", None, orjson.dumps(doc))
    assert bad.value.message == "source-changes event at (top level): breaks the schema's oneOf rule"
