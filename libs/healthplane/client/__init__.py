"""Typed reads and commands: what the CLI, the api, federation and the simulator call."""
