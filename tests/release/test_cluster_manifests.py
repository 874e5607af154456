"""The cluster manifests in release/cluster/: RayService against its schema and Ray's Serve schema, the tier
config inside it against Tandem's own, Prometheus config and alert rules (promtool when installed: rule
unit tests included), and the OTel collector's pipelines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from gateway.config import TandemConfig

CLUSTER = Path(__file__).resolve().parents[2] / "release" / "cluster"
IMPORT_PATH = "gateway.serve_app:app_builder"
PROMTOOL = shutil.which("promtool")


def load(name: str) -> Any:
    return yaml.safe_load((CLUSTER / name).read_text())


def rayservice() -> dict[str, Any]:
    return dict(load("rayservice.yaml"))


def schema() -> dict[str, Any]:
    return dict(json.loads((CLUSTER / "rayservice.schema.json").read_text()))


def gpu_workers(service: dict[str, Any]) -> list[dict[str, Any]]:
    groups = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return [
        g for g in groups if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]
    ]


# ---------------------------------------------------------------------------------------------- RayService
def test_rayservice_validates_against_the_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(rayservice(), schema())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(apiVersion="ray.io/v1alpha1"), "'ray.io/v1' was expected"),
        (lambda s: s["spec"].pop("serveConfigV2"), "'serveConfigV2' is a required property"),
        (lambda s: s["spec"].update(serveConfigV2={"applications": []}), "is not of type 'string'"),
        (lambda s: s["spec"]["rayClusterConfig"].pop("headGroupSpec"), "'headGroupSpec' is a required"),
        (lambda s: s["spec"]["rayClusterConfig"].update(workerGroupSpecs=[]), "should be non-empty"),
        (
            lambda s: s["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][
                0
            ]["resources"]["limits"].pop("nvidia.com/gpu"),
            "does not contain items matching",
        ),
        (
            lambda s: s["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].update(
                {"num-cpus": 0}
            ),
            "is not of type 'string'",
        ),
    ],
)
def test_schema_rejects_broken_rayservices(mutate: Any, message: str) -> None:
    service = rayservice()
    mutate(service)
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.validate(service, schema())
    assert message in caught.value.message, caught.value.message


def test_embedded_serve_config_is_a_valid_serve_config() -> None:
    serve_config = yaml.safe_load(rayservice()["spec"]["serveConfigV2"])
    parsed = ServeDeploySchema.model_validate(serve_config)
    assert [app.import_path for app in parsed.applications] == [IMPORT_PATH]
    assert parsed.applications[0].route_prefix == "/"


def test_embedded_tier_config_fits_the_gpu_workers() -> None:
    service = rayservice()
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    config = TandemConfig.model_validate(app["args"]["config"])
    assert {tier.name for tier in config.tiers} == {"standard", "fast"}
    workers = gpu_workers(service)
    assert workers, "no GPU worker group"
    gpus_per_pod = max(int(w["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                       for w in workers)  # fmt: skip
    total_gpus = sum(
        int(w["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        * w["maxReplicas"]
        for w in workers
    )
    for tier in config.tiers:
        # A replica's tensor-parallel ranks share one pod (NCCL over /dev/shm), so they must fit on one.
        assert tier.engine.tensor_parallel_size <= gpus_per_pod, tier.name
        assert tier.engine.dtype == "bfloat16"
    needed = sum(tier.engine.tensor_parallel_size * tier.replicas for tier in config.tiers)
    assert needed <= total_gpus
    for worker in workers:
        limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
        requests = worker["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"]  # Kubernetes requires equal GPU counts
        assert worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"]


def test_local_serve_config_is_valid_and_matches_the_cluster_application() -> None:
    local = ServeDeploySchema.model_validate(load("serve-config.yaml"))
    cluster = ServeDeploySchema.model_validate(yaml.safe_load(rayservice()["spec"]["serveConfigV2"]))
    assert [a.import_path for a in local.applications] == [a.import_path for a in cluster.applications]
    assert [a.name for a in local.applications] == [a.name for a in cluster.applications]
    args = local.applications[0].args
    assert args is not None
    config = TandemConfig.model_validate(args["config"])
    assert config.engine.tensor_parallel_size == 1 and config.engine.dtype == "float32"  # CPU defaults


def test_ray_serve_schema_rejects_a_config_without_import_path() -> None:
    broken = load("serve-config.yaml")
    del broken["applications"][0]["import_path"]
    with pytest.raises(ValueError, match="import_path"):
        ServeDeploySchema.model_validate(broken)


# ---------------------------------------------------------------------------------------------- Prometheus
PROMQL_FUNCTION = re.compile(r"\b([a-z_]+)\s*\(")
KNOWN_FUNCTIONS = {"sum", "rate", "histogram_quantile", "absent", "by", "ignoring", "on"}


def _balanced(expr: str) -> bool:
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_alert_rules_have_the_expected_groups_and_alerts() -> None:
    rules = load("alert-rules.yml")
    groups = {group["name"]: group["rules"] for group in rules["groups"]}
    assert set(groups) == {"tandem-recording", "tandem-alerts"}
    recorded = {rule["record"] for rule in groups["tandem-recording"]}
    alerts = {rule["alert"]: rule for rule in groups["tandem-alerts"]}
    assert set(alerts) == {
        "TandemHighErrorRate",
        "TandemCandidateErrorRateAboveStable",
        "TandemHighTimeToFirstToken",
        "TandemSpeculativeAcceptanceDrop",
        "TandemMetricsMissing",
    }
    for rule in [*groups["tandem-recording"], *alerts.values()]:
        expr = rule["expr"]
        assert _balanced(expr), expr
        assert set(PROMQL_FUNCTION.findall(expr)) <= KNOWN_FUNCTIONS, expr
    for name, alert in alerts.items():
        assert re.fullmatch(r"\d+[smh]", alert["for"]), name
        assert alert["labels"]["severity"] in {"page", "ticket"}
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        used = set(re.findall(r"tandem:[a-z0-9_:]+", alert["expr"]))
        assert used <= recorded, f"{name} uses unrecorded series {used - recorded}"


def test_alert_rules_read_the_metrics_the_rollout_controller_reads() -> None:
    from release.rollout import MetricsConfig

    text = (CLUSTER / "alert-rules.yml").read_text()
    metrics = MetricsConfig()
    for name in (metrics.requests, metrics.errors, f"{metrics.ttft}_bucket", metrics.drafted_tokens,
                 metrics.accepted_tokens):  # fmt: skip
        assert name in text, name


def test_prometheus_scrape_config_structure() -> None:
    config = load("prometheus.yml")
    assert config["rule_files"] == ["alert-rules.yml"] and (CLUSTER / "alert-rules.yml").is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"ray-nodes", "tandem-gateway"} <= set(jobs)
    assert jobs["tandem-gateway"]["metrics_path"] == "/metrics"
    # TandemMetricsMissing watches the job by name: renaming it must rename the alert's selector too.
    assert 'job="tandem-gateway"' in (CLUSTER / "alert-rules.yml").read_text()
    # The Ray metrics port the scrape keeps is the one the RayService exports on every node.
    service = rayservice()
    cluster = service["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["rayStartParams"]["metrics-export-port"] == "8080"
        ports = group["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "metrics", "containerPort": 8080} in ports


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_checks_rules_and_runs_the_rule_unit_tests() -> None:
    assert PROMTOOL is not None
    for argv in (["check", "rules", "alert-rules.yml"], ["test", "rules", "alert-rules.test.yml"]):
        done = subprocess.run([PROMTOOL, *argv], cwd=CLUSTER, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=CLUSTER, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    if done.returncode != 0 and "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        # Debian builds Prometheus without Kubernetes discovery: check everything else with static targets.
        config = load("prometheus.yml")
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        shutil.copy(CLUSTER / "alert-rules.yml", tmp_path / "alert-rules.yml")
        done = subprocess.run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------- OTel
def test_otel_collector_pipelines_are_consistent() -> None:
    config = load("otel-collector.yaml")
    defined = {kind: set(config.get(kind) or {}) for kind in ("receivers", "processors", "exporters")}
    pipelines = config["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    used: dict[str, set[str]] = {kind: set() for kind in defined}
    for name, pipeline in pipelines.items():
        assert name.split("/")[0] in {"traces", "metrics", "logs"}, name
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in defined:
            missing = set(pipeline.get(kind, [])) - defined[kind]
            assert not missing, f"pipeline {name} uses undefined {kind}: {missing}"
            used[kind] |= set(pipeline.get(kind, []))
        processors = pipeline.get("processors", [])
        # The collector's own guidance: memory_limiter first, batch last.
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", name
    assert used == defined, "every defined component is used by a pipeline"
    assert set(config["service"].get("extensions", [])) <= set(config.get("extensions") or {})
    ports = {
        config["receivers"]["otlp"]["protocols"][p]["endpoint"].rsplit(":", 1)[1] for p in ("grpc", "http")
    }
    assert ports == {"4317", "4318"}
    # The gateway sends OTLP/HTTP to the collector: the Serve configs point at its HTTP port.
    for serve_config in (load("serve-config.yaml"), yaml.safe_load(rayservice()["spec"]["serveConfigV2"])):
        env = serve_config["applications"][0]["runtime_env"]["env_vars"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4318")
    # Prometheus scrapes the collector's metrics exporter.
    exporter_port = config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    targets = {t for job in load("prometheus.yml")["scrape_configs"] for s in job.get("static_configs", [])
               for t in s["targets"]}  # fmt: skip
    assert any(t.endswith(f":{exporter_port}") for t in targets)
