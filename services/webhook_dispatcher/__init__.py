"""webhook-dispatcher: node events to HTTP endpoints as signed CloudEvents (WEB-*)."""
