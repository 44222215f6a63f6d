"""What crosses the bus: wire records, subjects, streams, permissions, config."""
