"""A shard's lifecycle: assign, restore, serve, revoke."""
