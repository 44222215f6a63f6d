"""substrate-bridge: the latest resource report per node in KV ``substrate-nodes`` (BRG-*)."""
