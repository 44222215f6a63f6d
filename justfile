# Healthplane tasks. Run through ./dev, which prepares .venv first.

set shell := ["bash", "-euo", "pipefail", "-c"]

default:
    @just --list

# Run the control plane with a simulated fleet on an embedded nats-server
up *ARGS:
    healthplane up {{ARGS}}

# Run the whole test suite (real nats-server; promtool installed when missing)
test *ARGS:
    python -m pytest -q {{ARGS}}

# Lint and type-check
lint:
    ruff check libs services tests
    mypy libs/healthplane

# Benchmarks: prints a table and writes bench-results.json
bench *ARGS:
    python -m pytest -q -p no:cacheprovider tests/bench -o addopts="" -o timeout=3600 -s {{ARGS}}

# Regenerate proto/ (JSON Schema + AsyncAPI) from the wire Structs
proto:
    python -m healthplane.proto proto
