"""health-ingest: reports in; conditions, heartbeat and health state out (ING-*)."""
