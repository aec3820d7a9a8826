"""The `freshplan` command and its subcommands."""
