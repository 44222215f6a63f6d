"""The `slurm` fixture is a real Slurm 22.05 (SLU-7): nodes that register and run jobs where
they are sent, drains with reasons that survive a controller restart, and a teardown that
leaves no process behind. (Requeues on this Slurm: tests/component/test_slurm_adapter.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.slurm import SlurmCluster, slurm_cluster

pytestmark = pytest.mark.slurm


def test_four_idle_nodes_run_a_job_where_it_is_sent(slurm: SlurmCluster) -> None:
    assert slurm.nodes == ("sim-000", "sim-001", "sim-002", "sim-003")
    assert [(n["name"], n["state"], n["state_flags"]) for n in slurm.nodes_json()] == [
        (name, "idle", []) for name in slurm.nodes]

    job_id = slurm.sbatch(node="sim-002", name="probe")
    slurm.wait_for(lambda: (slurm.job(job_id) or {}).get("job_state") == "RUNNING", 10, "the job running")
    job = slurm.job(job_id)
    assert job is not None and (job["nodes"], job["name"]) == ("sim-002", "probe")
    assert slurm.node("sim-002")["state"] == "allocated"


def test_a_drain_shows_with_its_reason_and_resume_makes_the_node_idle(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "nodename=sim-001", "state=drain", "reason=healthplane: x")
    node = slurm.node("sim-001")
    assert (node["state"], node["state_flags"], node["reason"]) == ("idle", ["DRAIN"], "healthplane: x")

    slurm.resume("sim-001")
    slurm.wait_until_idle(10)
    assert slurm.node("sim-001")["reason"] == ""


def test_a_drain_survives_a_controller_restart(slurm: SlurmCluster) -> None:
    slurm.drain("sim-003", "healthplane: kept")
    slurm.stop_controller()
    assert slurm.run("scontrol", "ping", check=False).returncode != 0

    slurm.start_controller()
    node = slurm.node("sim-003")
    assert (node["state"], node["state_flags"], node["reason"]) == ("idle", ["DRAIN"], "healthplane: kept")
    assert [n["state"] for n in slurm.nodes_json() if n["name"] != "sim-003"] == ["idle"] * 3


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    with slurm_cluster(tmp_path / "slurm", nodes=("sim-000", "sim-001")) as cluster:
        running = [cluster.sbatch(node=name) for name in cluster.nodes]
        cluster.wait_for(lambda: all((cluster.job(j) or {}).get("job_state") == "RUNNING" for j in running),
                         10, "both jobs running")
        # A node that dies orphans its job: slurmstepd ignores SIGTERM and outlives slurmd.
        cluster.kill_slurmd("sim-000")
        assert "slurmstepd" in {Path(f"/proc/{pid}/comm").read_text().strip() for pid in cluster.pids()}
    assert cluster.pids() == []
    cluster.stop()  # idempotent
