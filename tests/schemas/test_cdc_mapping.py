"""The CDC mapping file: parsing, refusal messages, its JSON Schema, and row mapping."""

from __future__ import annotations

import json

import fastjsonschema
import pytest

from schemas.cdc_mapping import FIELDS, MappingError, apply, mapping_schema, parse
from schemas.codec import schema_text
from schemas.connect_types import ColumnError

GOOD = {"tables": {"kb.documents": {"kind": "resource", "fields": {"id": "doc_id", "tokens": "n", "attributes": "acl"},
                                    "types": {"acl": "json"}, "defaults": {"sensitivity": "internal"}}}}


def test_fields_match_the_source_changes_schema():
    defs = json.loads(schema_text("source-changes"))["$defs"]
    for kind, names in FIELDS.items():
        assert set(names) == set(defs[kind]["properties"]), kind


@pytest.mark.parametrize("doc, words", [
    ("{", "not valid JSON"), ({"tables": []}, "exactly one key"),
    ({"tables": {"t.a": {"kind": "resource", "fields": {"id": "a", "colour": "c"}}}},
     "unknown resource fields ['colour']"),
    ({"tables": {"t.a": {"kind": "resource", "fields": {"tokens": "n"}}}}, "must map the id field"),
    ({"tables": {"t.a": {"kind": "robot", "fields": {"id": "a"}}}}, "kind resource, principal or entity"),
    ({"tables": {"t.a": {"kind": "principal", "fields": {"id": "a"}, "types": {"a": "money"}}}}, "unknown type"),
    ({"tables": {"t.a": {"kind": "entity", "fields": {"id": "a"}, "defaults": {"roles": []}}}},
     "unknown entity fields"),
    ({"tables": {"t.a": {"kind": "entity", "fields": {"id": "a"}, "extra": 1}}}, "unknown keys")])
def test_unusable_files_are_refused_by_name(doc, words):
    with pytest.raises(MappingError) as bad:
        parse(doc if isinstance(doc, str) else json.dumps(doc), "m.json")
    assert words in str(bad.value) and "m.json" in str(bad.value)


def test_the_json_schema_accepts_what_parse_accepts_and_rejects_unknown_fields():
    check = fastjsonschema.compile(mapping_schema())
    check(GOOD)
    with pytest.raises(fastjsonschema.JsonSchemaException):
        check({"tables": {"t.a": {"kind": "resource", "fields": {"id": "a", "colour": "c"}}}})
    parse(json.dumps(GOOD))


def test_apply_maps_columns_types_and_defaults_and_ignores_new_columns():
    table = parse(json.dumps(GOOD)).tables["kb.documents"]
    assert apply(table, {"doc_id": 7, "n": 3, "acl": '{"a": 1}', "new_column": "x"}, {}) == {
        "id": "7", "tokens": 3, "attributes": {"a": 1}, "sensitivity": "internal"}
    schema = {"acl": {"type": "string"}}  # the envelope's schema wins: no logical type, so no parse
    assert apply(table, {"doc_id": "d", "acl": "{}"}, schema)["attributes"] == "{}"
    with pytest.raises(ColumnError, match="column acl: is not valid JSON"):
        apply(table, {"doc_id": "d", "acl": "{"}, {})


def test_attribute_fields_map_boolean_and_uuid_columns_beside_the_attributes_column():
    doc = {"tables": {"kb.documents": {"kind": "resource", "fields": {
        "id": "doc_id", "attributes": "acl", "attributes.archived": "archived", "attributes.external_ref": "ref"},
        "types": {"acl": "json", "archived": "boolean", "ref": "uuid"}, "defaults": {"attributes.region": "eu"}}}}
    fastjsonschema.compile(mapping_schema())(doc)
    table = parse(json.dumps(doc)).tables["kb.documents"]
    row = {"doc_id": "d", "acl": '{"allowed_roles": ["a"], "archived": "x"}', "archived": 1,
           "ref": "6F1C2A4E-9B3D-4C5E-8A7F-0123456789AB"}
    attributes = apply(table, row, {})["attributes"]
    assert attributes == {"allowed_roles": ["a"], "archived": True, "region": "eu",
                          "external_ref": "6f1c2a4e-9b3d-4c5e-8a7f-0123456789ab"}
    assert attributes["archived"] is True  # Cedar must see a Boolean, not the Long 1
    schema = {"archived": {"type": "boolean"}, "ref": {"type": "string", "name": "io.debezium.data.Uuid"}}
    assert apply(table, {"doc_id": "d", "archived": False, "ref": None}, schema)["attributes"] == {
        "archived": False, "region": "eu"}  # a NULL column is no attribute (a policy reading it is denied)
    with pytest.raises(ColumnError, match="column archived: is not a boolean"):
        apply(table, {"doc_id": "d", "archived": "maybe"}, {})
    for fields, words in (({"id": "a", "attributes.bad-name": "c"}, "unknown resource fields"),
                          ({"id": "a", "attributes.x": "c"}, "unknown entity fields")):
        kind = "entity" if "entity" in words else "resource"
        with pytest.raises(MappingError, match=words):
            parse(json.dumps({"tables": {"t.a": {"kind": kind, "fields": fields}}}))
        with pytest.raises(fastjsonschema.JsonSchemaException):
            fastjsonschema.compile(mapping_schema())({"tables": {"t.a": {"kind": kind, "fields": fields}}})
