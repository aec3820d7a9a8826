"""A frozen record with the quick `__init__` is the record the dataclass's own `__init__` builds, and stays frozen."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import pytest

from agents.stream.raw_message import RawMessage
from schemas.quick_init import quick_init
from schemas.records import Resource


def _twins():
    """The same record class twice: with the dataclass's own `__init__`, and with the quick one."""
    def make():
        @dataclass(frozen=True, slots=True)
        class Record:
            name: str
            size: int
            tags: tuple[str, ...] = ()
            attributes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
            note: str | None = None
        return Record
    return make(), quick_init(make())


@pytest.mark.parametrize("args, kwargs", [(("a", 1), {}), (("a", 1, ("x",)), {"note": "n"}),
                                          ((), {"name": "b", "size": 2, "attributes": {"k": 1}}),
                                          (("c", 3, (), MappingProxyType({"z": 0}), None), {})])
def test_the_quick_init_builds_what_the_dataclass_init_builds(args, kwargs):
    plain, quick = _twins()
    made, fast = plain(*args, **kwargs), quick(*args, **kwargs)
    assert [getattr(made, f.name) for f in dataclasses.fields(made)] == \
        [getattr(fast, f.name) for f in dataclasses.fields(fast)]
    assert repr(made) == repr(fast) and fast == quick(*args, **kwargs)
    assert dataclasses.replace(fast, size=9).size == 9 and fast.size == (kwargs.get("size") or args[1])


def test_a_quick_record_stays_frozen_and_refuses_what_its_dataclass_refuses():
    _, quick = _twins()
    record = quick("a", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.size = 2  # type: ignore[misc]
    assert quick("a", 1).attributes == {}  # the default factory ran
    for bad in ((), ("a",), ("a", 1, (), {}, None, "extra")):
        with pytest.raises(TypeError):
            quick(*bad)
    with pytest.raises(TypeError):
        quick("a", 1, colour="red")  # type: ignore[call-arg]


def test_classes_it_cannot_mirror_are_refused_at_import():
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            raise ValueError

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        a: int

    for cls in (NoSlots, NotFrozen, Checked, KeywordOnly):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_hot_records_use_it_and_keep_their_defaults():
    m = RawMessage("source-changes", 1, 5, b"k", b"v")
    assert (m.timestamp, m.lane, m.notice, m.original_size) == (None, None, False, None)
    assert m == RawMessage("source-changes", 1, 5, b"k", b"v") and hash(m) == hash(RawMessage(*dataclasses.astuple(m)))
    r = Resource("r1", 2, "E1", "status", 40)
    assert r.attributes == {} and r.sensitivity == "internal" and r.supports == () and not r.log_ordered
    assert RawMessage.__init__.__qualname__ == "RawMessage.__init__"
