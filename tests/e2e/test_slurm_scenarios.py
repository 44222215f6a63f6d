"""Issue 19's scenarios on the whole system beside a real Slurm: `healthplane up --scheduler
slurm` (every service, the Slurm adapter instead of the reference scheduler) next to a real
slurmctld with four slurmd (sim-000..sim-003, tests/support/slurm.py), a simulated fleet of
the same four nodes reporting every 5 s (sim-002 and sim-003 provisioned), jobs from `sbatch`,
operators through `healthplane node` and `scontrol` (SLU-1..5, SLU-7, EVI-2, EVI-7, POL-1).

One stack and one Slurm for the module, in file order; each scenario uses its own nodes and
leaves them as it found them, so that the suite pays for one start."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from healthplane.contracts import wire
from tests.e2e.test_eviction_scenarios import Stack, _stack, until
from tests.support.slurm import SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.nats, pytest.mark.slurm]
# Scenarios release nodes that a later one faults again, minutes apart: no suppression after
# an operator's uncordon, and no breaker counting the scenarios' cordons together.
SETTINGS = "  maxUnavailablePercent: 50\n  cordonSuppressionMinutes: 0\n  circuitBreaker: {enabled: false}\n"
CONFIG = "nodeHealth:\n  mode: cordon\n" + SETTINGS
# VAL-4: how long a validation's job waits behind a user's before the user's ends: well
# beyond the smoke suite's own run, so that a duration counting the wait would show.
QUEUED_S = 6


class Site:
    def __init__(self, stack: Stack, slurm: SlurmCluster) -> None:
        self.stack, self.slurm = stack, slurm

    def drained(self, node: str) -> bool:
        return "DRAIN" in self.slurm.node(node)["state_flags"]

    def reason(self, node: str) -> str:
        return str(self.slurm.node(node)["reason"])

    def job_state(self, job: str) -> str:
        return str((self.slurm.job(job) or {}).get("job_state"))

    def ok(self, *args: str) -> str:
        done = self.stack.cli(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def heal(self, *nodes: str) -> None:
        """Repair: the simulated fault cleared and the service recorded (a hardware Xid holds
        until then), no condition left; then release the holds."""
        for node in nodes:
            self.ok("sim", "inject", node, "--fault", "clear")
            self.ok("node", "service", node, "--reason", "GPU reseated")

        async def healthy() -> bool:  # no fault left (the failure tally may still cost points); a
            # drain an administrator set in Slurm stays evidence (JOB-4), never Healthplane's to clear
            views = [await self.stack.view(n) for n in nodes]
            return all(c.type == "scheduler_drained" for view in views for c in view.conditions)

        await until(healthy)
        for node in nodes:
            self.ok("node", "uncordon", node)

    async def wait(self, check: Callable[[], bool], what: str, timeout: float = 45) -> None:
        async def checked() -> bool:
            return check()

        checked.__name__ = what
        await until(checked, timeout)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("slurm-site")
    with slurm_cluster(root / "slurm") as slurm:
        env = {**os.environ, "SLURM_CONF": str(slurm.conf), "HEALTHPLANE_SLURM_INTERVAL_SECONDS": "1",
               "HEALTHPLANE_SLURM_CONFIRM_SECONDS": "3"}
        for stack in _stack(root, CONFIG, "--scheduler", "slurm", env=env):
            stack_json = json.loads((root / "hp" / "stack.json").read_text())
            names = [s["name"] for s in stack_json["services"]]
            assert "slurm-adapter" in names and "scheduler" not in names
            yield Site(stack, slurm)


@pytest.fixture(autouse=True)
def no_job_left(site: Site) -> Iterator[None]:
    """A scenario that fails leaves no job behind to block the next one's nodes."""
    yield
    site.slurm.run("scancel", f"--user={getpass.getuser()}", check=False)
    site.slurm.wait_for(lambda: not [j for j in site.slurm.run("squeue", "-h", "-o", "%i").stdout.split()], 30,
                        "no job left")


def test_slu2_a_fault_drains_in_slurm_and_the_release_resumes_but_a_hand_drain_stays(site: Site) -> None:
    """SLU-2: a fault → policy cordons → Slurm shows the node drained with our reason; the
    fault healed and the hold released → resumed. A node an administrator drained by hand,
    then faulted and healed in Healthplane, is never resumed by us."""
    async def scenario() -> None:
        site.slurm.drain("sim-002", "bad DIMM, ticket 4711")
        for node in ("sim-001", "sim-002"):
            site.ok("sim", "inject", node, "--fault", "xid:48", "--gpu", "0")

        async def cordoned() -> bool:
            return [(await site.stack.view(n)).status for n in ("sim-001", "sim-002")] == ["CORDONED"] * 2

        await until(cordoned)
        await site.wait(lambda: site.drained("sim-001"), "sim-001 drained in Slurm")
        hold = (await site.stack.view("sim-001")).holds[0]
        assert site.reason("sim-001").startswith(f"healthplane: hold {hold.id} (cordon: ")
        assert site.reason("sim-002") == "bad DIMM, ticket 4711"

        async def evidence() -> bool:  # JOB-4: the administrator's drain, with its reason, in the view
            return any(c.type == "scheduler_drained" and "bad DIMM, ticket 4711" in c.message
                       for c in (await site.stack.view("sim-002")).conditions)

        await until(evidence)
        await site.heal("sim-001", "sim-002")
        await site.wait(lambda: not site.drained("sim-001"), "sim-001 resumed in Slurm")
        await asyncio.sleep(3)  # three more passes of the adapter
        assert site.drained("sim-002") and site.reason("sim-002") == "bad DIMM, ticket 4711"
        site.slurm.resume("sim-002")

    asyncio.run(scenario())


def test_slu2_an_administrators_resume_in_slurm_releases_the_hold_as_actor_slurm(site: Site) -> None:
    """SLU-2: an operator's cordon drains the node in Slurm; an administrator RESUMEs it there;
    the hold is released by actor slurm (HOLD_RELEASED in the node's history), the node is
    READY in Healthplane and stays resumed in Slurm."""
    async def scenario() -> None:
        site.ok("node", "cordon", "sim-000", "--reason", "checking cables")
        await site.wait(lambda: site.drained("sim-000"), "sim-000 drained in Slurm")
        # Well past HEALTHPLANE_SLURM_CONFIRM_SECONDS (3) since Slurm set it, as the adapter saw it
        # last: a drain in slurmctld's saved state, not one a crash could have lost.
        await asyncio.sleep(6)
        site.slurm.resume("sim-000")

        async def released() -> bool:
            return any(e.node_id == "sim-000" and e.actor == "slurm" for e in await site.stack.events("HOLD_RELEASED"))

        await until(released)

        async def ready() -> bool:  # the view follows the event: the scorer folds it next
            return (await site.stack.view("sim-000")).status == "READY"

        await until(ready)
        await asyncio.sleep(2)  # two more passes
        assert not site.drained("sim-000")

    asyncio.run(scenario())


def test_slu4_drain_active_requeues_in_slurm_and_fails_what_cannot_be_requeued(site: Site) -> None:
    """SLU-3, SLU-4, EVI-2: `node show` counts the node's running Slurm job; `node drain
    --active` → the requeueable job is requeued by Slurm and runs on another node; the
    --no-requeue one is cancelled, the reason in the NODE_DRAINED event and its record."""
    async def scenario() -> None:
        movable = site.slurm.sbatch("sleep 600", requeue=True, exclude="sim-001,sim-002")  # sim-000 or -003
        stuck = site.slurm.sbatch("sleep 600", node="sim-001", requeue=False)
        await site.wait(lambda: site.job_state(movable) == site.job_state(stuck) == "RUNNING", "both running")
        first = str((site.slurm.job(movable) or {})["nodes"])
        other = "sim-003" if first == "sim-000" else "sim-000"

        async def counted() -> bool:  # eviction knows both jobs: what drain --active acts on
            return [json.loads(site.ok("node", "show", n, "-o", "json"))["jobs"] for n in (first, "sim-001")] == [1, 1]

        await until(counted)
        assert site.ok("node", "drain", first, "--active", "--reason", "failing disk").strip() == (
            "Cordoned 1 node(s); requeued 1 allocation(s)")
        drained = site.ok("node", "drain", "sim-001", "--active", "--reason", "failing disk")
        assert drained.strip() == "Cordoned 1 node(s); requeued 0 allocation(s); failed 1 that cannot be requeued"
        await site.wait(lambda: (site.slurm.job(movable) or {}).get("restart_cnt") == 1, "the requeue in Slurm")
        await site.wait(lambda: site.job_state(stuck) == "CANCELLED", "the cancel in Slurm")
        await site.wait(lambda: site.job_state(movable) == "RUNNING", "the requeued job running again", timeout=60)
        assert (site.slurm.job(movable) or {})["nodes"] == other
        [event] = [e for e in await site.stack.events("NODE_DRAINED") if e.node_id == "sim-001"]
        assert event.message == f"drained (active); 0 allocation(s) requeued; 1 failed, not requeueable: job {stuck}"

        async def recorded() -> bool:
            ended = [a for a in (await site.stack.allocations()).values() if a.job_id == stuck]
            return bool(ended) and ended[0].state == "failed"

        await until(recorded)
        [record] = [a for a in (await site.stack.allocations()).values() if a.job_id == stuck]
        assert record.reason == (f"node sim-001 was drained: failing disk; job {stuck} failed: its scheduler "
                                 "cannot requeue it (submitted not requeueable)")
        site.slurm.run("scancel", movable)
        for node in (first, "sim-001"):
            site.ok("node", "uncordon", node)
        await site.wait(lambda: not site.drained(first) and not site.drained("sim-001"), "resumed")

    asyncio.run(scenario())


def test_evi7_a_job_failing_on_a_node_with_a_gpu_fault_is_attributed_and_moves_the_score(site: Site) -> None:
    """SLU-3, EVI-7: a real Slurm job that fails on a node carrying a GPU fault →
    JOB_FAILURE_ATTRIBUTED (GPU_XID_ERRORS), and the node's score counts it."""
    async def scenario() -> None:
        script, fail = site.slurm.held(then="exit 1")  # fails once the fault is in
        job = site.slurm.sbatch(script, node="sim-002", requeue=False)
        await site.wait(lambda: site.job_state(job) == "RUNNING", "the job running")
        # GPU 1: sim-002's GPU 0 had its Xid in the first scenario, serviced since.
        site.ok("sim", "inject", "sim-002", "--fault", "xid:48", "--gpu", "1")

        async def faulted() -> bool:
            return (await site.stack.view("sim-002")).score == 55

        await until(faulted)
        fail()

        async def attributed() -> bool:
            return any(e.node_id == "sim-002" for e in await site.stack.events("JOB_FAILURE_ATTRIBUTED"))

        await until(attributed)
        [event] = [e for e in await site.stack.events("JOB_FAILURE_ATTRIBUTED") if e.node_id == "sim-002"]
        assert event.fault_class == "GPU_XID_ERRORS" and event.message.startswith(f"job {job} failed on a node with")

        async def scored() -> bool:
            view = await site.stack.view("sim-002")
            return view.attributed_failures.count == 1 and (view.score or 100) < 55

        await until(scored)
        await site.heal("sim-002")
        await site.wait(lambda: not site.drained("sim-002"), "sim-002 resumed")

    asyncio.run(scenario())


def test_slu5_a_drain_asked_while_slurmctld_is_down_for_30_s_lands_once_it_is_back(site: Site) -> None:
    """SLU-5: slurmctld down for 30 s; an operator cordons a node meanwhile; once the
    controller is back the adapter applies the drain by itself."""
    async def scenario() -> None:
        site.slurm.stop_controller()
        stopped = time.monotonic()
        try:
            site.ok("node", "cordon", "sim-003", "--reason", "fan noise")

            async def cordoned() -> bool:
                return (await site.stack.view("sim-003")).status == "CORDONED"

            await until(cordoned)
            await asyncio.sleep(max(0.0, 30 - (time.monotonic() - stopped)))
        finally:
            site.slurm.start_controller()
        await site.wait(lambda: site.drained("sim-003"), "the drain after slurmctld returned", timeout=60)
        assert site.reason("sim-003").endswith("(cordon: fan noise)")
        site.ok("node", "uncordon", "sim-003")
        await site.wait(lambda: not site.drained("sim-003"), "sim-003 resumed")

    asyncio.run(scenario())


def test_pol4_replace_mode_waits_for_the_nodes_running_slurm_job(site: Site, tmp_path: Path) -> None:
    """SLU-3, POL-4: in replace mode a provisioned node's running Slurm job is waited for —
    the node drains in Slurm, no termination until the job has ended — then the teardown
    goes to Slurm, whose answer for a node that is not a cloud node is the provisioner's."""
    async def scenario() -> None:
        config = tmp_path / "replace.yaml"
        config.write_text("nodeHealth:\n  mode: replace\n" + SETTINGS)
        site.ok("config", "apply", "-f", str(config))
        script, end_job = site.slurm.held()  # still running when policy acts
        job = site.slurm.sbatch(script, node="sim-003", requeue=False)
        await site.wait(lambda: site.job_state(job) == "RUNNING", "the job running")

        async def counted() -> bool:  # the adapter's record of the job is in before the fault
            return json.loads(site.ok("node", "show", "sim-003", "-o", "json"))["jobs"] == 1

        await until(counted)
        for fault in ("xid:48", "edac-ue"):  # 100 - 45 - 45 = 10: below drainBelow
            site.ok("sim", "inject", "sim-003", "--fault", fault, "--gpu", "0")

        async def waiting() -> bool:
            return any("waiting for 1 allocation(s)" in e.message for e in await site.stack.events("POLICY_ACTED"))

        await until(waiting)
        await site.wait(lambda: site.drained("sim-003"), "sim-003 draining in Slurm")
        assert site.job_state(job) == "RUNNING"
        terminations = [d for d in await site.stack.directives() if d.action == "terminate"]
        records = [(a.id, a.state, a.reason) for a in (await site.stack.allocations()).values()
                   if a.node_id == "sim-003"]
        assert not terminations, f"terminated while job {job} runs; sim-003's allocations: {records}"
        end_job()

        async def answered() -> list[wire.TerminationResult]:
            return [wire.decode(wire.TerminationResult, m.data)
                    for m in await site.stack.read("HP_COMMANDS", "hp.provision.>")]

        async def answer_came() -> bool:
            return bool(await answered())

        await until(answer_came, timeout=60)
        assert site.job_state(job) == "COMPLETED"
        answer = (await answered())[0]
        assert not answer.accepted and "Slurm refused to power down sim-003" in answer.message

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- validation runs (VAL-1, VAL-4)

# Observe mode: a failed validation raises validation_failed and nothing more, so that no
# automation holds the nodes of the scenarios below.
VALIDATION_CONFIG = "nodeHealth:\n  mode: observe\n" + SETTINGS + """\
validation:
  suites:
    smoke: {command: [sh, -c, "echo Result: PASS"], timeoutSeconds: 60, passWhen: {exitCode: 0, outputMatches: "^Result: PASS$"}}
    gpu-burn: {command: [sh, -c, "echo checking GPU 0; echo 'GPU 0: FAIL (row remap pending)'; exit 3"], timeoutSeconds: 60}
  defaultSuite: smoke
"""


def slurm_jobs_named(site: Site, name: str) -> list[dict[str, object]]:
    return [dict(j) for j in json.loads(site.slurm.run("squeue", "--json", "-t", "all").stdout)["jobs"]
            if j["name"] == name]


def our_reservations(site: Site) -> list[str]:
    return [line.split()[0] for line in site.slurm.run("scontrol", "show", "reservation", "-o").stdout.splitlines()
            if line.startswith("ReservationName=healthplane-")]


async def validation_event(site: Site, kind: str, node: str) -> wire.NodeEvent:
    [event] = [e for e in await site.stack.events(kind) if e.node_id == node]
    assert event.validation is not None
    return event


def test_val1_node_validate_runs_a_real_sbatch_job_on_exactly_that_node_and_records_the_verdict(
        site: Site, tmp_path: Path) -> None:
    """VAL-1: `node validate NODE --suite S` → one real sbatch job, named after the validation
    job, on exactly that node; a failing suite (exit 3) → VALIDATION_FAILED naming the exit
    status and the output's last line, exit 1; a passing one → VALIDATION_PASSED, exit 0, and
    validation_failed cleared; no reservation of ours left behind."""
    async def scenario() -> None:
        config = tmp_path / "validation.yaml"
        config.write_text(VALIDATION_CONFIG)
        site.ok("config", "apply", "-f", str(config))
        failed = site.stack.cli("node", "validate", "sim-000", "--suite", "gpu-burn", "--timeout", "50")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        event = await validation_event(site, "VALIDATION_FAILED", "sim-000")
        assert event.validation is not None
        assert (event.validation.suite, event.validation.reason) == (
            "gpu-burn", "exit status 3 (passes with 0): GPU 0: FAIL (row remap pending)")
        assert event.validation.reason in failed.stderr
        [ran] = slurm_jobs_named(site, event.validation.job)
        assert (ran["nodes"], ran["job_state"], ran["exit_code"]) == ("sim-000", "FAILED", 3 << 8)

        passed = site.stack.cli("node", "validate", "sim-000", "--suite", "smoke", "--timeout", "50")
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert passed.stdout.startswith("sim-000: validation passed: suite smoke in ")
        event = await validation_event(site, "VALIDATION_PASSED", "sim-000")
        assert event.validation is not None
        [ran] = slurm_jobs_named(site, event.validation.job)
        assert (ran["nodes"], ran["job_state"], ran["exit_code"]) == ("sim-000", "COMPLETED", 0)

        async def cleared() -> bool:
            return (await site.stack.view("sim-000")).conditions == []

        await until(cleared)
        await site.wait(lambda: our_reservations(site) == [], "our reservations deleted")
        assert not site.drained("sim-000")

    asyncio.run(scenario())


def test_val1_val4_a_held_busy_node_is_validated_once_its_job_ends_and_drained_again(site: Site) -> None:
    """VAL-1, VAL-4, SLU-2: sim-001 runs a user job and is then cordoned (drained in Slurm with
    our reason). `node validate` reserves it (no new user work), lifts our drain (a DRAIN node
    runs nothing), and the run waits for the user job, which ends undisturbed; the run's
    duration is its own, not its queued time; afterwards the node is drained again for its
    hold and the reservation is gone."""
    async def scenario() -> None:
        # The user job runs until the validation's own job has queued behind it for a while:
        # the cordon, the drain and `node validate` all come while it runs, however loaded
        # the machine (a fixed `sleep 40` once had them take over 15 s).
        script, end_user_job = site.slurm.held()
        user = site.slurm.sbatch(script, node="sim-001", requeue=False)
        await site.wait(lambda: site.job_state(user) == "RUNNING", "the user job running")
        site.ok("node", "cordon", "sim-001", "--reason", "suspect NVLink")
        await site.wait(lambda: site.drained("sim-001"), "sim-001 drained in Slurm")
        validating = asyncio.create_task(asyncio.to_thread(
            site.stack.cli, "node", "validate", "sim-001", "--timeout", "100", timeout=120))
        await site.wait(lambda: site.slurm.run("squeue", "-h", "-t", "PENDING", "-o", "%i").stdout.split() != [],
                        "the validation's job queued behind the user's")
        await asyncio.sleep(QUEUED_S)
        end_user_job()
        done = await validating
        assert done.returncode == 0, done.stdout + done.stderr
        event = await validation_event(site, "VALIDATION_PASSED", "sim-001")
        assert event.validation is not None and event.validation.suite == "smoke"
        [ran] = slurm_jobs_named(site, event.validation.job)
        waited = site.slurm.job(user) or {}
        assert ran["nodes"] == "sim-001" and waited["job_state"] == "COMPLETED"
        queued = int(waited["end_time"]) - int(str(ran["submit_time"]))
        assert queued >= QUEUED_S - 1 and int(str(ran["start_time"])) >= int(waited["end_time"])
        assert (event.validation.duration_seconds or 0) < queued  # VAL-4: the wait is not the run's
        await site.wait(lambda: site.drained("sim-001") and our_reservations(site) == [], "drained again, unreserved")
        assert site.reason("sim-001").endswith("(cordon: suspect NVLink)")
        site.ok("node", "uncordon", "sim-001")
        await site.wait(lambda: not site.drained("sim-001"), "sim-001 resumed")

    asyncio.run(scenario())
