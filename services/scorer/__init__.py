"""scorer: a 0-100 reliability score per node that explains itself (SCO-*)."""
