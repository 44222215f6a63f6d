"""Validation runs on a real Slurm 22.05 (VAL-1, SLU-5): `healthplane service slurm-adapter`
against the tests' own slurmctld and four slurmd (tests/support/slurm.py) and a real
nats-server. The test plays eviction: it appends a validation job to ``hp.job`` and reads the
step records the adapter stores; the whole CLI path is tests/e2e/test_slurm_scenarios.py's."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.contracts import subjects, wire
from healthplane.stack.natsserver import NatsServer
from tests.component.test_slurm_adapter import Adapter, allocations, until
from tests.support.slurm import SlurmCluster

pytestmark = [pytest.mark.nats, pytest.mark.slurm]
RUN = "val-00c0ffee00c0ffee"
# Every node of the run prints its own name, after more output than a record keeps.
NOISY = ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo; sleep 3; echo \"rank on $SLURMD_NODENAME: ok\""]


async def test_val1_a_two_node_run_is_one_sbatch_over_both_submitted_once_across_a_restart(
        nc: NATS, js: JetStreamContext, slurm: SlurmCluster, nats_server: NatsServer, tmp_path: Path) -> None:
    """VAL-1, SLU-5: a run over sim-001 and sim-002 is one Slurm job named after it, over both
    nodes, in a reservation of them, the command once per node; the adapter killed -9 while the
    job runs and started again submits nothing twice; each step ends finished with exit 0 and
    the output's tail (bounded), written once; the reservation goes."""
    output_dir = tmp_path / "validation"  # made by the adapter
    suite = wire.ValidationSuite(name="noisy", command=NOISY, timeout_seconds=120)
    job = wire.Job(id=RUN, cluster="default", steps=2, duration_seconds=0, submitted_at=datetime.now(UTC),
                   submitted_by="eviction", nodes=["sim-001", "sim-002"], validation=suite)
    adapter = Adapter(nats_server, slurm, tmp_path, HEALTHPLANE_SLURM_OUTPUT_DIR=str(output_dir)).start()
    try:
        await js.publish(subjects.job("default", RUN), wire.encode(job))

        def named() -> list[dict[str, object]]:
            found = json.loads(slurm.run("squeue", "--json", "-t", "all").stdout)["jobs"]
            return [j for j in found if j["name"] == RUN]

        await until(lambda: [j["job_state"] for j in named()] == ["RUNNING"], what="the run's job running")
        assert f"ReservationName=healthplane-{RUN} " in slurm.run("scontrol", "show", "reservation", "-o").stdout
        adapter.kill()
        adapter.start()

        async def ended() -> bool:
            return sum(1 for a in await allocations(nc, js) if a.job_id == RUN and a.state == "finished") == 2

        await until(ended, timeout=60, what="both steps finished")
        [ran] = named()
        assert (ran["job_state"], ran["nodes"], ran["exit_code"]) == ("COMPLETED", "sim-[001-002]", 0)
        records = [a for a in await allocations(nc, js) if a.job_id == RUN]
        counts = Counter((a.id, a.state) for a in records)
        assert max(counts.values()) == 1, f"a record written twice: {counts}"
        done = {a.node_id: a for a in records if a.state == "finished"}
        assert sorted(done) == ["sim-001", "sim-002"]
        for record in done.values():
            assert (record.exit_code, record.timed_out, record.nodes) == (0, False, ["sim-001", "sim-002"])
            output = record.output or ""
            assert len(output.encode()) <= wire.OUTPUT_TAIL_BYTES
            assert "rank on sim-001: ok" in output and "rank on sim-002: ok" in output
        assert (output_dir / f"{RUN}.out").stat().st_size > 200_000  # all of it on disk, for the operator

        def unreserved() -> bool:
            return f"healthplane-{RUN}" not in slurm.run("scontrol", "show", "reservation", "-o").stdout

        await until(unreserved, what="the reservation deleted")
        await asyncio.sleep(1.5)  # three more passes: nothing more
        assert Counter((a.id, a.state) for a in await allocations(nc, js)) == counts
    finally:
        adapter.stop()
