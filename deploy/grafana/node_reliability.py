"""Builds the Grafana "Node Reliability" dashboard (OBS-3) with grafana-foundation-sdk.

    python deploy/grafana/node_reliability.py          # rewrite dashboards/node-reliability.json
    python deploy/grafana/node_reliability.py --check  # exit 1 when the committed file is stale

The JSON is generated, never edited by hand; tests/monitoring checks it is current and runs
every query in it against a real Prometheus scraping `healthplane up`.

Every query over node series takes `max by (cluster, node_id)` first, as the alert rules do:
during a scorer failover two replicas can serve the same node for a moment, and a sum
would count it twice.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "node-reliability.json"
UID = "healthplane-node-reliability"

# Equal to the policy defaults and to the alert rules; change all three together.
CORDON_BELOW = 60
DRAIN_BELOW = 45

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
NODES = 'cluster=~"$cluster", node_id=~"$node"'
FLEET = 'cluster=~"$cluster"'


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False,
          table: bool = False) -> prometheus.Dataquery:
    """A Prometheus target. ``instant`` for "now" panels (one bar per series); ``table`` for
    a table panel, one row per series with its labels as columns."""
    built = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        built = built.legend_format(legend)
    if instant or table:
        built = built.instant()
    if table:
        built = built.format(PromQueryFormat.TABLE)
    return built


def score_thresholds() -> dashboard.ThresholdsConfig:
    return dashboard.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps([
        models.Threshold(value=None, color="red"),
        models.Threshold(value=DRAIN_BELOW, color="orange"),
        models.Threshold(value=CORDON_BELOW, color="yellow"),
        models.Threshold(value=96, color="green"),  # above degradedAtOrBelow (95)
    ])


def severity_mappings() -> list[models.ValueMapping]:
    return [models.ValueMap(options={
        "1": models.ValueMappingResult(text="info", color="blue", index=0),
        "2": models.ValueMappingResult(text="warning", color="orange", index=1),
        "3": models.ValueMappingResult(text="critical", color="red", index=2),
    })]


def health_by_state() -> stat.Panel:
    return (
        stat.Panel().title("Nodes by health state")
        .description("Nodes per health state (healthy, degraded, unknown): unknown means never "
                     "reported, heartbeat missed, or only a failing collector.")
        .datasource(DATASOURCE)
        .with_target(query(
            f"sum by (state) (max by (cluster, node_id, state) (healthplane_node_health{{{FLEET}}}))",
            "{{state}}"))
        .text_mode(common_models.BigValueTextMode.VALUE_AND_NAME)
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .graph_mode(common_models.BigValueGraphMode.NONE)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .override_by_name("healthy", [models.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": "green"})])
        .override_by_name("degraded", [models.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": "orange"})])
        .override_by_name("unknown", [models.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": "text"})])
        .height(5).span(10)
    )


def lowest_score() -> stat.Panel:
    return (
        stat.Panel().title("Lowest score in the fleet")
        .description(f"The worst reliability score among scored nodes. Below {CORDON_BELOW} a "
                     f"cordon policy acts; below {DRAIN_BELOW} no new work is placed.")
        .datasource(DATASOURCE)
        .with_target(query(f"min(max by (cluster, node_id) (healthplane_node_reliability_score{{{FLEET}}}))"))
        .min(0).max(100)
        .thresholds(score_thresholds())
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .height(5).span(4)
    )


def lowest_nodes() -> bargauge.Panel:
    return (
        bargauge.Panel().title("Lowest-scoring nodes")
        .datasource(DATASOURCE)
        .with_target(query(
            f"bottomk(10, max by (cluster, node_id) (healthplane_node_reliability_score{{{FLEET}}}))",
            "{{node_id}}", instant=True))
        .min(0).max(100)
        .thresholds(score_thresholds())
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .height(5).span(10)
    )


def score_history() -> timeseries.Panel:
    return (
        timeseries.Panel().title("Score history per node")
        .description(f"Dashed lines: cordonBelow ({CORDON_BELOW}) and drainBelow ({DRAIN_BELOW}). "
                     "An unscored node has no line, not a line at zero.")
        .datasource(DATASOURCE)
        .with_target(query(f"max by (cluster, node_id) (healthplane_node_reliability_score{{{NODES}}})",
                           "{{node_id}}"))
        .min(0).max(100)
        .thresholds(dashboard.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps([
            models.Threshold(value=None, color="transparent"),
            models.Threshold(value=DRAIN_BELOW, color="red"),
            models.Threshold(value=CORDON_BELOW, color="orange"),
        ]))
        .thresholds_style(common.GraphThresholdsStyleConfig().mode(common_models.GraphThresholdsStyleMode.DASHED))
        .legend(common.VizLegendOptions().display_mode(common_models.LegendDisplayMode.TABLE)
                .placement(common_models.LegendPlacement.RIGHT).show_legend(True).calcs(["lastNotNull", "min"]))
        .height(9).span(24)
    )


def active_conditions() -> table.Panel:
    return (
        table.Panel().title("Active conditions")
        .description("Every raised condition per node, with its severity.")
        .datasource(DATASOURCE)
        .with_target(query(
            f"max by (cluster, node_id, condition) (healthplane_node_condition{{{NODES}}}) > 0",
            table=True))
        .with_transformation(models.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True},
            "renameByName": {"node_id": "node", "Value": "severity"},
            "indexByName": {"cluster": 0, "node_id": 1, "condition": 2, "Value": 3},
        }))
        .mappings(severity_mappings())
        .override_by_name("severity", [models.DynamicConfigValue(
            id_val="custom.cellOptions", value={"type": "color-text"})])
        .sort_by([common.TableSortByFieldState().display_name("severity").desc(True)])
        .height(9).span(12)
    )


def attributed_failures() -> bargauge.Panel:
    return (
        bargauge.Panel().title("Job failures attributed per node")
        .description("Job failures attributed to a fault on the node (count since the node was "
                     "first seen; each one lowers the score, decaying).")
        .datasource(DATASOURCE)
        .with_target(query(
            f"topk(20, max by (cluster, node_id) (healthplane_node_attributed_failures_total{{{NODES}}}) > 0)",
            "{{node_id}}", instant=True))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(dashboard.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps([
            models.Threshold(value=None, color="orange"),
        ]))
        .height(9).span(12)
    )


def bucket_usage() -> timeseries.Panel:
    return (
        timeseries.Panel().title("substrate-nodes bucket")
        .description("Bytes stored against the cap (nodesBucketMaxBytes). Absent until the "
                     "substrate-bridge's first sample, which is not the same as empty.")
        .datasource(DATASOURCE)
        .with_target(query("max(healthplane_substrate_nodes_bucket_bytes_used)", "used", "A"))
        .with_target(query("max(healthplane_substrate_nodes_bucket_bytes_max)", "cap", "B"))
        .with_target(query("0.8 * max(healthplane_substrate_nodes_bucket_bytes_max)", "alert at 80 %", "C"))
        .unit("bytes").min(0)
        .override_by_name("alert at 80 %", [models.DynamicConfigValue(
            id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})])
        .height(8).span(8)
    )


def put_failures() -> timeseries.Panel:
    return (
        timeseries.Panel().title("Rejected puts and messages")
        .description("Resource reports the bucket refused (redelivered until stored), and input "
                     "messages a service rejected as malformed.")
        .datasource(DATASOURCE)
        .with_target(query(
            "sum(rate(healthplane_substrate_nodes_bucket_put_failures_total[$__rate_interval]))",
            "bucket put failures", "A"))
        .with_target(query(
            "sum by (service, reason) (rate(healthplane_messages_rejected_total[$__rate_interval]))",
            "{{service}} rejected: {{reason}}", "B"))
        .unit("ops").min(0)
        .height(8).span(8)
    )


def consumer_lag() -> timeseries.Panel:
    return (
        timeseries.Panel().title("Consumer lag")
        .description("Messages in each input stream not yet delivered to its service. A lag that "
                     "never returns to zero and keeps climbing raises HealthplaneConsumerLagGrowing.")
        .datasource(DATASOURCE)
        .with_target(query(
            "max by (service, stream, consumer) (healthplane_consumer_lag_messages)",
            "{{service}} ← {{stream}}"))
        .unit("short").min(0)
        .height(8).span(8)
    )


# Breakfix series (issue 41.5) come from every api replica with the same values: max by, not sum.
BREAKFIX_STAGE = ("max by (cluster, fault_class, stage) (healthplane_breakfix_seconds_{part}{{{fleet}}})")


def breakfix_times() -> table.Panel:
    mean = (BREAKFIX_STAGE.format(part="sum", fleet=FLEET) + " / "
            + BREAKFIX_STAGE.format(part="count", fleet=FLEET))
    return (
        table.Panel().title("Breakfix: mean time per stage")
        .description("Per cluster and fault class, the mean seconds from a fault to out of service, to "
                     "remediated, to back in service (MTTR), and between incidents on a node, over the "
                     "node events stored (90 days). From the api's /metrics.")
        .datasource(DATASOURCE)
        .with_target(query(mean, table=True))
        .with_transformation(models.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True},
            "renameByName": {"fault_class": "fault class", "Value": "mean"},
            "indexByName": {"cluster": 0, "fault_class": 1, "stage": 2, "Value": 3},
        }))
        .unit("s")
        .height(8).span(16)
    )


def breakfix_incidents() -> bargauge.Panel:
    return (
        bargauge.Panel().title("Breakfix: incidents per fault class")
        .description("Incidents (a real fault's critical condition on a node with none open) over the "
                     "node events stored, per cluster and fault class.")
        .datasource(DATASOURCE)
        .with_target(query(f"max by (cluster, fault_class) (healthplane_breakfix_incidents_total{{{FLEET}}})",
                           "{{cluster}} {{fault_class}}", instant=True))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .height(8).span(8)
    )


def build() -> models.Dashboard:
    prometheus_source = dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    cluster = (
        dashboard.QueryVariable("cluster").label("Cluster")
        .query("label_values(healthplane_node_health, cluster)")
        .datasource(DATASOURCE)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*")
    )
    node = (
        dashboard.QueryVariable("node").label("Node")
        .query(f"label_values(healthplane_node_health{{{FLEET}}}, node_id)")
        .datasource(DATASOURCE)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*")
    )
    built = (
        dashboard.Dashboard("Node Reliability")
        .uid(UID)
        .description("Healthplane node health: states, scores, conditions, attributed failures, "
                     "breakfix times, and the pipeline that produces them.")
        .tags(["healthplane"])
        .editable()
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(prometheus_source)
        .with_variable(cluster)
        .with_variable(node)
        .with_row(dashboard.Row("Fleet"))
        .with_panel(health_by_state())
        .with_panel(lowest_score())
        .with_panel(lowest_nodes())
        .with_row(dashboard.Row("Nodes"))
        .with_panel(score_history())
        .with_panel(active_conditions())
        .with_panel(attributed_failures())
        .with_row(dashboard.Row("Pipeline"))
        .with_panel(bucket_usage())
        .with_panel(put_failures())
        .with_panel(consumer_lag())
        # Last: the panels above keep their ids (links use viewPanel=N).
        .with_row(dashboard.Row("Breakfix"))
        .with_panel(breakfix_times())
        .with_panel(breakfix_incidents())
        .build()
    )
    # Stable ids, one per panel and row: links to a panel (viewPanel=N) keep working.
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return built


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
