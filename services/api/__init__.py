"""api: the HTTP API and the web UI over the streams (API-1..5)."""
