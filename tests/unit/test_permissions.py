"""SEC-1: the permission templates, generated from the stream table, give each identity what
it uses and nothing another identity owns. (The server enforcing them: tests/component/test_security.py.)"""

from __future__ import annotations

import importlib
import importlib.util

from hypothesis import given
from hypothesis import strategies as st

from healthplane.cli import registry
from healthplane.contracts import permissions, streams, subjects, wire
from healthplane.contracts.subjects import encode_token


def _expand(template: str, cluster: str = "", node: str = "", user: str = "") -> str:
    """What nats-server makes of a template for a user with these tags."""
    return (template.replace(permissions.CLUSTER, encode_token(cluster) if cluster else "")
            .replace(permissions.NODE_ID, encode_token(node) if node else "").replace(permissions.USER, user))


def _allowed(role: str, subject: str, **tags: str) -> bool:
    return any(subjects.matches(_expand(p, **tags), subject) for p in permissions.of(role).publish)


def _fold(service: str) -> object | None:
    name = f"healthplane_{service.replace('-', '_')}.fold"
    return importlib.import_module(name) if importlib.util.find_spec(name) else None


def test_sec1_the_table_names_every_service_the_stack_runs() -> None:
    assert set(streams.SERVICES) == set(registry.CONTROL_PLANE)
    assert set(streams.SCHEDULERS) == set(registry.SCHEDULERS.values())  # the same scheduler integrations
    assert set(streams.EVENT_WRITERS) == set(wire.EVENT_TYPES)
    assert set(streams.EVENT_WRITERS.values()) <= set(streams.SERVICES)


def test_sec1_every_service_may_read_its_inputs_and_write_its_outputs() -> None:
    for service in streams.SERVICES:
        module = _fold(service)
        if module is None or not hasattr(module, "INPUTS"):
            continue  # the webhook dispatcher reads through its own loop
        reads = set(permissions.reads(service))
        for wanted in module.INPUTS:  # type: ignore[attr-defined]
            assert wanted.stream in reads, f"{service} reads {wanted.stream} but may not"
        written = {s.name for s in streams.STREAMS if any(permissions.writes(service, c) for c in s.channels)}
        # A bucket is a stream too (the bridge's puts into substrate-nodes, BRG-1).
        written |= {f"KV_{bucket}" for bucket in (streams.NODES_BUCKET, streams.LEASES_BUCKET)
                    if f"$KV.{bucket}.>" in permissions.of(service).publish}
        assert set(module.OUTPUTS) <= written, f"{service} writes {module.OUTPUTS} but may write only {written}"  # type: ignore[attr-defined]


def test_sec1_each_event_type_has_exactly_its_one_writer() -> None:
    for kind, owner in streams.EVENT_WRITERS.items():
        subject = subjects.event("c1", "n1", kind)
        # The maintainer replays dead letters onto the subject they came from (SEC-10).
        may = [role for role in permissions.ROLES if role != permissions.MAINTAINER and _allowed(role, subject)]
        assert may == [owner], f"{kind}: {may}"
    assert not _allowed("scorer", subjects.event("c1", "n1", "HOLD_CREATED"))


tokens = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@given(cluster=tokens, node=tokens, other=tokens)
def test_sec1_a_node_template_binds_it_to_its_own_two_subjects(cluster: str, node: str, other: str) -> None:
    mine = {"cluster": cluster, "node": node}
    assert _allowed(permissions.NODE, subjects.report(cluster, node), **mine)
    assert _allowed(permissions.NODE, subjects.resource(cluster, node), **mine)
    if other != node:
        assert not _allowed(permissions.NODE, subjects.report(cluster, other), **mine)
    if other != cluster:
        assert not _allowed(permissions.NODE, subjects.report(other, node), **mine)
    for forbidden in (subjects.command(cluster, node, "cordon", node), subjects.CONFIG,
                      subjects.event(cluster, node, "NODE_REGISTERED"), "$JS.API.CONSUMER.CREATE.HP_REPORTS"):
        assert not _allowed(permissions.NODE, forbidden, **mine)
    assert permissions.reads(permissions.NODE) == ()


@given(user=st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True), other=st.from_regex(r"[A-Za-z0-9_-]{1,16}",
                                                                                         fullmatch=True))
def test_sec1_an_admin_commands_only_as_herself_and_a_viewer_not_at_all(user: str, other: str) -> None:
    assert _allowed(permissions.ADMIN, subjects.command("c1", "n1", "cordon", user), user=user)
    assert _allowed(permissions.ADMIN, subjects.CONFIG, user=user)
    if other != user:
        assert not _allowed(permissions.ADMIN, subjects.command("c1", "n1", "cordon", other), user=user)
    assert not _allowed(permissions.VIEWER, subjects.command("c1", "n1", "cordon", user), user=user)
    assert not _allowed(permissions.VIEWER, subjects.CONFIG, user=user)
    assert not any(p.startswith("hp.") for p in permissions.of(permissions.VIEWER).publish)


def test_sec1_policy_commands_only_as_policy() -> None:
    assert _allowed("policy", subjects.command("c1", "n1", "drain", "policy"))
    assert not _allowed("policy", subjects.command("c1", "n1", "drain", "alice"))


def test_slu2_the_slurm_adapter_only_releases_holds_as_slurm() -> None:
    """SLU-2, SEC-1: an administrator's RESUME in Slurm becomes a hold release by actor slurm;
    the adapter's identity can do nothing else with commands, and writes what a scheduler
    writes."""
    assert _allowed("slurm-adapter", subjects.command("c1", "n1", "hold-release", "slurm"))
    for verb, actor in (("cordon", "slurm"), ("deprovision", "slurm"), ("hold-release", "slurm-adapter"),
                        ("hold-release", "alice")):
        assert not _allowed("slurm-adapter", subjects.command("c1", "n1", verb, actor)), (verb, actor)
    assert _allowed("slurm-adapter", subjects.allocation("c1", "n1", "slurm-7-0-n1"))
    assert _allowed("slurm-adapter", subjects.provision("c1", "n1"))
    assert not _allowed("slurm-adapter", subjects.directive("c1", "n1"))


def test_sec1_every_inbox_is_its_own() -> None:
    # A federation member's identity is a leaf connection, not a client: it has no inbox.
    clients = [role for role in permissions.ROLES if role != permissions.MEMBER]
    prefixes = {role: permissions.inbox(role) for role in clients}
    assert len(set(prefixes.values())) == len(prefixes)
    for role in clients:
        granted = permissions.of(role).subscribe
        assert f"{prefixes[role]}.>" in granted
        assert not any(s in ("_INBOX.>", ">") for s in granted)


def test_ha3_every_service_marks_only_as_itself_and_the_marks_take_no_purge_away() -> None:
    # HA-3 (runtime.fencing): a replica marks the streams it writes under its own name only;
    # the marks beside the scorer's views leave HP_NODES the scorer's alone to purge.
    for service in streams.SERVICES:
        mark = streams.fence_subject("HP_NODES", service)
        assert mark is not None and _allowed(service, mark)
        for other in streams.SERVICES:
            if other != service:
                assert not _allowed(other, mark), f"{other} may mark as {service}"
    assert "$JS.API.STREAM.PURGE.HP_NODES" in permissions.of("scorer").publish
    assert not [p for p in permissions.of("policy").publish if p.startswith("$JS.API.STREAM.PURGE.HP_NODES")]


def _member_may(direction: str, subject: str, cluster: str) -> bool:
    granted = permissions.of(permissions.MEMBER)
    templates = granted.publish if direction == "back" else granted.subscribe
    return any(subjects.matches(_expand(t, cluster=cluster), subject) for t in templates)


def test_fed1_a_member_writes_only_its_own_aggregate_and_the_hub_reaches_only_its_consumer_and_commands() -> None:
    """FED-1, FED-3: the member identity (a leaf connection; *publish* is what the member may
    send to the hub, *subscribe* what the hub may send into it)."""
    # back to the hub: its own deliveries and outcomes, replies to the hub's people
    assert _member_may("back", permissions.deliver_subject("a"), "a")
    assert not _member_may("back", permissions.deliver_subject("b"), "a")
    assert _member_may("back", subjects.command_outcome("a", "n1"), "a")
    assert not _member_may("back", subjects.command_outcome("b", "n1"), "a")
    assert _member_may("back", "_INBOX.admin.alice.x1", "a")
    for forged in (subjects.node_view("b", "n1"), subjects.node_view("a", "n1"), "$JS.API.STREAM.CREATE.HP_FED_a",
                   subjects.command("a", "n1", "cordon", "alice"), "_INBOX.service.scorer.x"):
        assert not _member_may("back", forged, "a"), forged
    # into the member: the hub consumer's API and flow control, and its own cluster's commands
    assert _member_may("into", "$JS.a.API.CONSUMER.INFO.HP_NODES.hub", "a")
    assert _member_may("into", "$JS.FC.HP_NODES.hub.x", "a")
    assert _member_may("into", subjects.command("a", "n1", "cordon", "alice"), "a")
    for foreign in (subjects.command("b", "n1", "cordon", "alice"), "$JS.a.API.STREAM.DELETE.HP_NODES",
                    "$JS.b.API.CONSUMER.INFO.HP_NODES.hub", subjects.node_view("a", "n1"),
                    "$JS.a.API.STREAM.MSG.GET.HP_COMMANDS"):
        assert not _member_may("into", foreign, "a"), foreign
