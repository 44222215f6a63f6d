"""Finding nodes by their views in ``HP_NODES`` (and, on a federation hub, in the members'
aggregates): what every read and command of one node starts with."""

from __future__ import annotations

from collections.abc import Iterable

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.client.connection import decoded, decoded_or_skipped
from healthplane.client.errors import EXIT_USAGE, CommandFailed, NodeNotFound
from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import read_last, read_payloads


async def find_node(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None,
                    streams: Iterable[str] = ("HP_NODES",)) -> wire.NodeView:
    """The node's view: in ``cluster``, or in whichever cluster holds it (a node id in several
    is a usage error naming them). ``streams``: where views are kept (a federation hub keeps
    one aggregate per member). One multi-subject direct get per stream (``read_last``), where a
    batch read took three requests (its stream info, the batch, a check at its end)."""
    subject = subjects.node_view(cluster, node_id) if cluster else subjects.node_view_in_any_cluster(node_id)
    found = [view for stream in streams for _, view in
             decoded(wire.NodeView, await read_last(js, stream, [subject]))]
    if not found:
        where = f" in cluster {cluster}" if cluster else ""
        raise NodeNotFound(f"node {node_id} not found{where}")
    if len(found) > 1:
        clusters = ", ".join(sorted(view.cluster for view in found))
        raise CommandFailed(f"node {node_id} exists in several clusters ({clusters}); name one with --cluster",
                            EXIT_USAGE)
    return found[0]


def views_of(payloads: Iterable[bytes]) -> list[wire.NodeView]:
    """The node views among ``payloads``; one that is not is named on stderr and skipped."""
    found = (decoded_or_skipped(wire.NodeView, payload, lambda: "HP_NODES record") for payload in payloads)
    return [view for view in found if view is not None]


def is_view(payload: bytes) -> bool:
    return bool(views_of([payload]))


async def node_views(nc: NATS, js: JetStreamContext, cluster: str | None) -> list[wire.NodeView]:
    """Every node's latest view (in ``cluster``, or everywhere), by cluster and node id."""
    payloads = await read_payloads(nc, js, "HP_NODES", subjects.node_views(cluster), last_per_subject=True)
    return sorted(views_of(payloads), key=lambda v: (v.cluster, v.node_id))


async def target(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None) -> tuple[str, str]:
    """(node, cluster) a command for ``node_id`` goes to. A node without a view yet is still
    sent (to the named or default cluster): eviction is the one that knows, and refuses an
    unknown node."""
    try:
        view = await find_node(nc, js, node_id, cluster)
    except CommandFailed as exc:
        if exc.code == EXIT_USAGE:
            raise
        return node_id, cluster or "default"
    return view.node_id, view.cluster

