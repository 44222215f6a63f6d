"""The eviction service: holds, drain, evict, deprovision, node loss and job attribution."""
