"""SEC-7 where services' records are read: the scheduler, the Slurm adapter and the api's read
model take a per-node record as its subject's node's or not at all. A record whose payload
names another node than its subject (a service gone wrong, a replay onto the wrong subject)
is refused (the folds: ``IdentityMismatch``, dead-lettered and counted by the runtime) or
skipped and counted (the api's index), and never shown under the wrong node."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from healthplane.contracts import subjects, wire
from healthplane.runtime.fold import IdentityMismatch, Inbound
from healthplane_api import fold as api_fold
from healthplane_scheduler.fold import SchedulerCore
from healthplane_slurm_adapter.fold import AdapterCore

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _view(node: str, cluster: str = "default") -> wire.NodeView:
    return wire.NodeView(node_id=node, cluster=cluster, hostname=node, status="READY", health="HEALTHY",
                         last_reported_at=T0, score=100, score_explanation=None, conditions=[],
                         attributed_failures=wire.AttributedFailures(), holds=[])


def _inbound(subject: str, record: wire.Record) -> Inbound:
    return Inbound("HP_NODES", 1, subject, wire.encode(record), {}, T0, True)


@pytest.mark.parametrize("core", [SchedulerCore(), AdapterCore("default")], ids=["scheduler", "slurm-adapter"])
def test_sec7_a_view_on_another_nodes_subject_is_refused(core: SchedulerCore | AdapterCore) -> None:
    state = core.initial_state()
    with pytest.raises(IdentityMismatch, match="the subject is the identity"):
        core.step(state, _inbound(subjects.node_view("default", "n1"), _view("n2")))  # type: ignore[arg-type]
    # Its own, with an id that needs escaping, is folded.
    core.step(state, _inbound(subjects.node_view("default", "10.0.0.42/9100"), _view("10.0.0.42/9100")))  # type: ignore[arg-type]


def test_sec7_the_api_never_shows_a_view_under_another_node() -> None:
    index = api_fold.ViewIndex()
    assert index.apply(msgspec.json.encode(_view("n2")), subjects.node_view("default", "n1")) is None
    assert index.rows == {} and index.mismatched == 1
    assert index.apply(msgspec.json.encode(_view("10.0.0.42/9100")),
                       subjects.node_view("default", "10.0.0.42/9100")) is not None
    assert list(index.rows) == [api_fold.key_of("default", "10.0.0.42/9100")]
