"""The CDC mapping file: which table feeds which record kind, column by column, with column types."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from schemas import connect_types
from schemas.connect_types import ColumnError

FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "resource": ("id", "version", "entity", "title", "content", "tokens", "evidence_class", "supports",
                 "contradicts", "valid_from", "valid_to", "observed_at", "superseded_by", "provenance_group",
                 "sensitivity", "attributes"),
    "principal": ("id", "roles", "attributes", "delegation_version"),
    "entity": ("id", "aliases"),
})
# Fields that are ids on the wire: a numeric primary key becomes its decimal text.
_ID_FIELDS = frozenset({"id", "entity", "superseded_by", "evidence_class"})
ATTRIBUTE = "attributes."
"""A field `attributes.<name>` maps one column to one attribute (Cedar sees `resource.<name>`), beside any
`attributes` column: a boolean or uuid column, say, which no other field takes."""
_ATTRIBUTE_NAME = r"^attributes\.[A-Za-z_][A-Za-z0-9_]*$"


def attribute_field(kind: str, field: str) -> bool:
    """Whether `field` names one attribute of a record of `kind` (`attributes.<name>`)."""
    return "attributes" in FIELDS[kind] and re.match(_ATTRIBUTE_NAME, field) is not None


class MappingError(ValueError):
    """A mapping file that cannot be used; the message names the file's problem."""


@dataclass(frozen=True)
class TableMapping:
    """How one source table's rows become records of one kind."""

    table: str
    """`schema.table` (Postgres, SQL Server) or `db.table` (MySQL)."""
    kind: str
    """resource, principal or entity."""
    fields: Mapping[str, str]
    """freshplan field -> column name."""
    types: Mapping[str, str]
    """column name -> declared type, used when an envelope carries no schema."""
    defaults: Mapping[str, Any]
    """freshplan field -> value when its column is missing from the row."""

    @property
    def id_column(self) -> str:
        """The column that names a row."""
        return self.fields["id"]


@dataclass(frozen=True)
class CdcMapping:
    """Every mapped table, by name."""

    tables: Mapping[str, TableMapping]
    """Table name -> its mapping."""

    def tables_keyed_by(self, columns: set[str]) -> list[TableMapping]:
        """The mapped tables whose id column is among a schema-less key's fields."""
        return [t for t in self.tables.values() if t.id_column in columns]


def mapping_schema() -> dict[str, Any]:
    """The JSON Schema of the mapping file (written by `freshplan schemas export`)."""
    def table(kind: str) -> dict[str, Any]:
        names: dict[str, Any] = {"enum": list(FIELDS[kind])}
        if "attributes" in FIELDS[kind]:
            names = {"anyOf": [names, {"pattern": _ATTRIBUTE_NAME}]}
        return {"type": "object", "required": ["kind", "fields"], "additionalProperties": False,
                "properties": {
                    "kind": {"const": kind},
                    "fields": {"type": "object", "required": ["id"], "propertyNames": names,
                               "additionalProperties": {"type": "string", "minLength": 1}},
                    "types": {"type": "object", "additionalProperties": {
                        "type": "string", "pattern": "^(json|timestamp_millis|timestamp_micros|timestamp_nanos"
                                                     "|iso|date_days|boolean|uuid|decimal:[0-9]{1,2})$"}},
                    "defaults": {"type": "object", "propertyNames": names}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://freshplan.dev/schemas/cdc-mapping.schema.json",
            "title": "FRESHPLAN_CDC_MAPPING: Debezium tables to freshplan records",
            "type": "object", "required": ["tables"], "additionalProperties": False,
            "properties": {"tables": {"type": "object", "additionalProperties": {
                "oneOf": [table(kind) for kind in FIELDS]}}}}


def parse(text: str, name: str = "the mapping file") -> CdcMapping:
    """Read a mapping file's text, or raise MappingError naming what is wrong with it."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise MappingError(f"{name} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"tables"} or not isinstance(doc["tables"], dict):
        raise MappingError(f"{name} must be an object with exactly one key, \"tables\"")
    return CdcMapping(MappingProxyType({t: _table(name, t, body) for t, body in doc["tables"].items()}))


def _table(name: str, table: str, body: Any) -> TableMapping:
    where = f"{name}: table {table!r}"
    if not isinstance(body, dict):
        raise MappingError(f"{where} must be an object")
    if unknown := set(body) - {"kind", "fields", "types", "defaults"}:
        raise MappingError(f"{where} has unknown keys {sorted(unknown)}; use kind, fields, types, defaults")
    kind = body.get("kind")
    if kind not in FIELDS:
        raise MappingError(f"{where} needs kind resource, principal or entity")
    fields, types, defaults = (body.get(k) or {} for k in ("fields", "types", "defaults"))
    if not all(isinstance(part, dict) for part in (fields, types, defaults)):
        raise MappingError(f"{where}: fields, types and defaults must be objects")
    for part, names in (("fields", fields), ("defaults", defaults)):
        if unknown := {f for f in names if f not in FIELDS[kind] and not attribute_field(kind, f)}:
            keyed = ", or attributes.<name>" if "attributes" in FIELDS[kind] else ""
            raise MappingError(f"{where} {part} names unknown {kind} fields {sorted(unknown)}; "
                               f"known: {', '.join(FIELDS[kind])}{keyed}")
    if "id" not in fields:
        raise MappingError(f"{where} must map the id field to a column")
    if not all(isinstance(c, str) and c for c in fields.values()):
        raise MappingError(f"{where} fields must map to column names (non-empty strings)")
    for column, type_name in types.items():
        if not isinstance(type_name, str) or not connect_types.valid_type(type_name):
            raise MappingError(f"{where} types: column {column!r} has an unknown type; use json, "
                               "timestamp_millis, timestamp_micros, timestamp_nanos, iso, date_days, boolean, uuid "
                               "or decimal:<scale>")
    return TableMapping(table, kind, MappingProxyType(dict(fields)), MappingProxyType(dict(types)),
                        MappingProxyType(dict(defaults)))


def apply(table: TableMapping, row: dict[str, Any], schema_fields: dict[str, dict]) -> dict[str, Any]:
    """Map one row onto a record of the table's kind; raise ColumnError(column, reason) on a bad column.

    The envelope's own logical types win over the file's declared types. Columns the file does
    not name are ignored, so a new column in the table changes nothing. `attributes.<name>` fields
    join the attributes (over a mapped `attributes` column's keys of that name).
    """
    record: dict[str, Any] = {}
    keyed = sorted(f for f in {*table.fields, *table.defaults} if f.startswith(ATTRIBUTE))
    for field in (*FIELDS[table.kind], *keyed):
        column = table.fields.get(field)
        if column is not None and column in row:
            value = row[column]
            try:
                if column in schema_fields:
                    value = connect_types.by_schema(schema_fields[column], value)
                elif column in table.types:
                    value = connect_types.by_name(table.types[column], value)
            except ColumnError as exc:
                raise ColumnError(f"column {column}: {exc}") from None
        elif field in table.defaults:
            value = table.defaults[field]
        else:
            continue
        if field in _ID_FIELDS and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if value is not None:
            record[field] = value
    named = {f[len(ATTRIBUTE):]: record.pop(f) for f in keyed if f in record}
    attributes = record.get("attributes", {})
    if named and isinstance(attributes, dict):  # anything else is the attributes column's schema violation
        record["attributes"] = {**attributes, **named}
    return record
