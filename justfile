# Healthplane tasks. Run through ./dev, which prepares .venv first.

set shell := ["bash", "-euo", "pipefail", "-c"]

default:
    @just --list

# Run the control plane with a simulated fleet on an embedded nats-server
up *ARGS:
    healthplane up {{ARGS}}

# Lint, type-check, then the whole test suite (each test starts its own nats-server;
# the monitoring tests need promtool and prometheus, installed from Debian when missing;
# the web UI's, Debian's Chromium and axe-core from npm).
# Tests mostly wait on real servers and processes, so 4 workers share 2 cores well; a file
# stays on one worker (its module-scoped stacks are built once). HEALTHPLANE_TEST_WORKERS=0
# runs them in this process. Prints the slowest 20 tests and the total.
test *ARGS: lint
    sh tools/ensure-prometheus
    sh tools/ensure-slurm
    sh tools/ensure-chromium
    sh tools/ensure-axe
    # Every `up`, service and CLI the suite starts (hundreds of processes) imports the project:
    # compiled once here, not again by each of them where PYTHONDONTWRITEBYTECODE keeps Python
    # from caching what it compiles (it is set on the machine this was measured on: a service's
    # imports took 0.93 CPU-s uncompiled, 0.70 compiled).
    python -m compileall -q libs services tests > /dev/null
    started=$(date +%s); status=0; python -m pytest -q -n "${HEALTHPLANE_TEST_WORKERS:-4}" --dist loadfile {{ARGS}} || status=$?; echo "dev test: pytest took $(( $(date +%s) - started )) s"; exit $status

# Lint and type-check
lint:
    ruff check libs services tests deploy/grafana
    # Service folders are installed as healthplane_<name>; mypy finds them through links.
    mkdir -p .cache/mypy-path && for d in services/*/; do n=$(basename "$d"); ln -sfn "$PWD/$d" ".cache/mypy-path/healthplane_$n"; done
    MYPYPATH=libs:.cache/mypy-path mypy -p healthplane $(for d in services/*/; do printf -- '-p healthplane_%s ' "$(basename "$d")"; done)

# Benchmarks: prints a table and writes bench-results.json
bench *ARGS:
    python -m pip install --quiet -c .cache/constraints.txt -e '.[dev,bench]'  # faststream, measured against the pull loop
    python -m pytest -q -p no:cacheprovider tests/bench -o addopts="" -o timeout=3600 -s {{ARGS}}

# Regenerate the README's pictures of the web UI (docs/img/) from a real `up` in Chromium
screenshots:
    sh tools/ensure-chromium
    python -m tests.support.screenshots docs/img

# Regenerate the pages drawn from the code (tests fail when they are stale)
docs:
    python -m tests.support.house docs/architecture.md
    python -m tests.support.permission_table docs/permissions.md

# Regenerate proto/ (JSON Schema + AsyncAPI) from the wire Structs
proto:
    python -m healthplane.contracts.proto proto
