"""DuckDB state: catalog, dependency index, plan and receipt store, offsets, outbox."""
