"""A plan's lifecycle: compile, store, announce, adopt (and take over by partition)."""
