"""Cluster and collector config: SPEC.md defaults, refusals that name the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from healthplane.contracts.config import (
    ClusterConfig,
    ConfigError,
    lease_ttl,
    load_cluster_config,
    load_collector_config,
    parse_cluster_config,
)


def test_defaults_match_spec() -> None:
    config = ClusterConfig()
    health = config.node_health
    assert (health.heartbeat_miss_threshold, health.mode, health.cordon_below, health.drain_below) == (3, "observe", 60, 45)
    assert (health.degraded_at_or_below, health.max_unavailable_percent, health.max_replacements_per_hour) == (95, 20, 3)
    assert (health.failure_tally_penalty, health.failure_tally_half_life_hours, health.quiet_reports_to_clear) == (5, 168, 1)
    assert health.circuit_breaker.percentage == 50 and health.circuit_breaker.duration_seconds == 300
    assert config.substrate.nodes_bucket_max_bytes is None  # unset changes nothing (BRG-1)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"nodeHealth": {"cordonBelow": 140}}, r"nodeHealth\.cordonBelow: Input should be less than or equal to 100 \(got 140\)"),
        ({"nodeHealth": {"mode": "nuke"}}, r"nodeHealth\.mode: Input should be 'observe', 'cordon', 'drain' or 'replace'"),
        ({"nodeHealth": {"cordonBelo": 50}}, r"nodeHealth\.cordonBelo: Extra inputs are not permitted"),
        ({"nodeHealth": {"drainBelow": 70}}, r"nodeHealth: drainBelow \(70\) must not be above cordonBelow \(60\)"),
        ({"substrate": {"nodesBucketMaxBytes": 1024}}, r"substrate\.nodesBucketMaxBytes: Input should be greater than or equal to 67108864"),
        ({"leases": {"ttlSeconds": 1}}, r"leases\.ttlSeconds: Input should be greater than or equal to 2"),
        ({"nodeEventWebhooks": [{"url": "ftp://x", "secretEnv": "S"}]}, r"nodeEventWebhooks\[0\]\.url"),
        ({"nodeEventWebhooks": [{"url": "https://x", "secretEnv": "S", "events": ["NOPE"]}]}, r"nodeEventWebhooks\[0\]\.events\[0\]"),
        ({"nodeHealth": {"circuitBreaker": {"duration": "soon"}}}, r"nodeHealth\.circuitBreaker\.duration: 'soon' is not a duration"),
        ({"nodeHealth": {"evictOnFaultClasses": ["GPU_XID_ERRORS", "BAD"]}}, r"nodeHealth\.evictOnFaultClasses: unknown fault class 'BAD'"),
        ({"provisionerDefinitions": {"gpu": {"nodeHealth": {"drainBelow": -1}}}}, r"provisionerDefinitions\.gpu\.nodeHealth\.drainBelow"),
    ],
)
def test_errors_name_the_field(document: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cluster_config(document)


def test_definition_overrides_merge_over_cluster() -> None:
    config = parse_cluster_config(
        {"nodeHealth": {"mode": "cordon", "penalties": {"SmartFailing": 30}},
         "provisionerDefinitions": {"gpu-pool": {"nodeHealth": {"drainBelow": 50, "penalties": {"GpuXidHardware": 60}}}}}
    )
    effective = config.node_health_for("gpu-pool")
    assert (effective.mode, effective.drain_below, effective.penalties) == ("cordon", 50, {"GpuXidHardware": 60})
    assert config.node_health_for(None).penalties == {"SmartFailing": 30}


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodeHealth:\n  mode: [observe\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_cluster_config(path)


def test_collector_config_is_kebab_case(tmp_path: Path) -> None:
    path = tmp_path / "collector.yaml"
    path.write_text(
        "binary: healthplane-collector\nenabled: true\nconfig:\n  node-id: cn-042\n  cluster: default\n"
        "  definition: gpu-pool\n  maintenance: true\n  nats-url: nats://controlplane:4222\n"
        "  health:\n    disabled: false\n    report-interval-seconds: 10\n"
    )
    settings = load_collector_config(path).config
    assert (settings.node_id, settings.definition, settings.maintenance) == ("cn-042", "gpu-pool", True)
    assert settings.health.report_interval_seconds == 10


def test_collector_config_refuses_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "collector.yaml"
    path.write_text("config:\n  health:\n    report-interval: 10\n")
    with pytest.raises(ConfigError, match=r"config\.health\.report-interval: Extra inputs are not permitted"):
        load_collector_config(path)


def test_cli_validate_exits_1_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster: prod\nnodeHealth:\n  cordonBelow: 140\n")
    result = subprocess.run([sys.executable, "-m", "healthplane.cli", "config", "validate", "-f", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "nodeHealth.cordonBelow" in result.stderr and "140" in result.stderr
    path.write_text("cluster: prod\nnodeHealth:\n  mode: cordon\n")
    result = subprocess.run([sys.executable, "-m", "healthplane.cli", "config", "validate", "-f", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_ha8_the_lease_ttl_in_force_is_the_environments_clamped_else_the_configs() -> None:
    configured = parse_cluster_config({"leases": {"ttlSeconds": 4}}, "test")
    assert lease_ttl(None, None) is None and lease_ttl(ClusterConfig(), "") is None  # unset: the bucket's stays
    assert lease_ttl(configured, None) == 4.0
    assert lease_ttl(configured, "6.5") == 6.5
    assert (lease_ttl(None, "0.5"), lease_ttl(None, "3600")) == (2.0, 60.0)  # an unvalidated path: clamped
    assert lease_ttl(configured, "soon") == 4.0 and lease_ttl(configured, "nan") == 4.0
