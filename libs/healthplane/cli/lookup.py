"""Finding nodes in ``HP_NODES``: what ``node show | events`` and the node actions share."""

from __future__ import annotations

from collections.abc import Iterable

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from healthplane.cli.common import EXIT_USAGE, CommandFailed, decoded, decoded_or_skipped
from healthplane.contracts import subjects, wire
from healthplane.runtime.replay import read_all


class NodeNotFound(CommandFailed):
    """No view of that node (the API's 404)."""


async def find_node(nc: NATS, js: JetStreamContext, node_id: str, cluster: str | None,
                    streams: Iterable[str] = ("HP_NODES",)) -> wire.NodeView:
    """The node's view: in ``cluster``, or in whichever cluster holds it (a node id in several
    is a usage error naming them). ``streams``: where views are kept (a federation hub keeps
    one aggregate per member)."""
    subject = subjects.node_view(cluster, node_id) if cluster else subjects.node_view_in_any_cluster(node_id)
    found = [view for stream in streams for _, view in
             decoded(wire.NodeView, await read_all(nc, js, stream, subject, last_per_subject=True))]
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
