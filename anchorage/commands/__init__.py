"""Subcommands of the `anchorage` CLI, one module each (see anchorage.cli)."""
