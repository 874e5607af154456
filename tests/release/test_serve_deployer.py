"""ServeDeployer against a fake Ray dashboard: which deployments it scales, to what, and when it returns."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.canary import deployment_name
from infra.errors import ConfigError, RolloutError
from release.rollout import RolloutConfig
from release.serve_deployer import ServeDeployer

CANDIDATE = "smollm2-135m-instruct@v2"
STABLE_TIERS = (deployment_name("tandem-standard"), deployment_name("tandem-fast"))
CANDIDATE_TIERS = (deployment_name("tandem-standard-candidate"), deployment_name("tandem-fast-candidate"))


class FakeDashboard:
    """Serve's REST API as the deployer sees it: replicas start after one poll, stop after one poll."""

    def __init__(self, *, external_scaler: bool = True) -> None:
        self.external_scaler = external_scaler
        self.targets = dict.fromkeys((*STABLE_TIERS, *CANDIDATE_TIERS), 1) | {"TandemIngress": 1}
        self.replicas: dict[str, list[dict[str, Any]]] = {
            name: [self._replica(name, "RUNNING")] for name in self.targets
        }
        self.scaled: list[tuple[str, int]] = []

    @staticmethod
    def _replica(name: str, state: str) -> dict[str, Any]:
        return {"replica_id": f"{name}-r", "actor_id": f"actor-{name}", "pid": 1, "state": state}

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            if not self.external_scaler:
                return httpx.Response(412, json={"error": "external_scaler_enabled=false"})
            name = request.url.path.split("/deployments/")[1].removesuffix("/scale")
            count = json.loads(request.content)["target_num_replicas"]
            self.scaled.append((name, count))
            self.targets[name] = count
            self.replicas[name] = [
                self._replica(name, "STARTING" if count else "STOPPING") for _ in range(max(count, 1))
            ]
            return httpx.Response(200, json={"message": "Scaling request received."})
        applications = {
            "tandem": {
                "deployments": {name: {"replicas": replicas} for name, replicas in self.replicas.items()}
            }
        }
        # The next read sees the scaling done.
        self.replicas = {
            name: [self._replica(name, "RUNNING") for _ in range(self.targets[name])] for name in self.targets
        }
        return httpx.Response(200, json={"applications": applications})


class FakeServeClient:
    """Ray's ServeSubmissionClient as the deployer uses it, reading the fake dashboard."""

    def __init__(self, dashboard: FakeDashboard) -> None:
        self.http = httpx.Client(base_url="http://dashboard", transport=httpx.MockTransport(dashboard.handle))

    def get_serve_details(self) -> dict[str, Any]:
        return dict(self.http.get("/api/serve/applications/").json())


def _deployer(config: RolloutConfig, dashboard: FakeDashboard) -> ServeDeployer:
    return ServeDeployer(
        config, transport=httpx.MockTransport(dashboard.handle), serve_client=FakeServeClient(dashboard)
    )


def _rollout(tmp_path: Path, candidate: str = CANDIDATE) -> RolloutConfig:
    gateway = tmp_path / "tandem.yaml"
    tiers = [
        {"name": "standard", "model_id": "tandem-standard"},
        {"name": "fast", "model_id": "tandem-fast", "speculative": {"method": "ngram"}},
    ]
    gateway.write_text(yaml.safe_dump({"tiers": tiers, "canary": {"model": CANDIDATE}}))
    return RolloutConfig.model_validate({
        "name": "unit",
        "stable": {"model": "smollm2-135m-instruct@base"},
        "candidate": {"model": candidate},
        "gate": {"path": str(tmp_path / "gate.md")},
        "steps": [{"weight": 100}],
        "deployment": {
            "deployer": "release.serve_deployer:ServeDeployer",
            "options": {"gateway_config": str(gateway), "dashboard_url": "http://dashboard", "poll_seconds": 0.01},
        },
    })  # fmt: skip


def test_deploy_and_remove_scale_only_that_release(tmp_path: Path) -> None:
    dashboard = FakeDashboard()
    config = _rollout(tmp_path)
    deployer = _deployer(config, dashboard)
    deployer.deploy("candidate", config.candidate)
    assert dashboard.scaled == [(name, 1) for name in CANDIDATE_TIERS]
    deployer.remove("stable", config.stable)
    assert dashboard.scaled[2:] == [(name, 0) for name in STABLE_TIERS]
    assert {name: len(replicas) for name, replicas in deployer.replicas().items()} == {
        STABLE_TIERS[0]: 0,
        STABLE_TIERS[1]: 0,
        CANDIDATE_TIERS[0]: 1,
        CANDIDATE_TIERS[1]: 1,
        "TandemIngress": 1,
    }


def test_refused_scale_names_the_deployment_and_the_cause(tmp_path: Path) -> None:
    config = _rollout(tmp_path)
    deployer = _deployer(config, FakeDashboard(external_scaler=False))
    with pytest.raises(RolloutError, match=r"scale LLMServer:tandem-standard-candidate to 0: HTTP 412"):
        deployer.remove("candidate", config.candidate)


def test_a_gateway_without_this_candidate_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="candidate slot for 'smollm2-135m-instruct@v2'"):
        ServeDeployer(_rollout(tmp_path, candidate="smollm2-135m-instruct@v3"))


def test_a_rollout_from_another_stable_release_is_refused(tmp_path: Path) -> None:
    config = _rollout(tmp_path)
    config.stable.model = "smollm2-135m-instruct@v1"
    with pytest.raises(
        RolloutError, match=r"stable release 'smollm2-135m-instruct@v1' is not what the gateway"
    ):
        ServeDeployer(config)


def test_unknown_option_names_the_field(tmp_path: Path) -> None:
    config = _rollout(tmp_path)
    config.deployment.options["dashbord_url"] = "http://typo"
    with pytest.raises(ConfigError, match="dashbord_url"):
        ServeDeployer(config)


def test_a_late_candidate_gets_its_own_applications(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """canary.late_candidates, from a process already connected to Ray: any candidate is deployed and removed by
    `python -m gateway.candidate_apps` in a child process; promotion still scales the stable tiers of the
    gateway's own application in place."""
    import subprocess

    from release import serve_deployer

    config = _rollout(tmp_path, candidate="smollm2-135m-instruct@v3")
    gateway = Path(config.deployment.options["gateway_config"])
    gateway.write_text(
        yaml.safe_dump(yaml.safe_load(gateway.read_text()) | {"canary": {"late_candidates": True}})
    )
    runs: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        runs.append(argv)
        return subprocess.CompletedProcess(argv, 0, "tandem-candidate-standard tandem-candidate-fast\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(serve_deployer, "_ray_connected", lambda: True)
    dashboard = FakeDashboard()
    deployer = _deployer(config, dashboard)
    deployer.deploy("candidate", config.candidate)
    deployer.remove("candidate", config.candidate)
    assert [argv[3] for argv in runs] == ["deploy", "remove"]
    assert all(argv[1:3] == ["-m", "gateway.candidate_apps"] for argv in runs)
    assert runs[0][-2:] == ["--model", "smollm2-135m-instruct@v3"] and dashboard.scaled == []
    deployer.remove("stable", config.stable)
    assert sorted(dashboard.scaled) == sorted((name, 0) for name in STABLE_TIERS)

    def failing_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            argv, 2, "", "error: smollm2-135m-instruct@v3 not found in file:///r"
        )

    monkeypatch.setattr(subprocess, "run", failing_run)
    with pytest.raises(RolloutError, match=r"deploy candidate applications: exit 2: .*@v3 not found"):
        deployer.deploy("candidate", config.candidate)


def test_a_late_candidate_is_deployed_in_process_without_a_ray_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployer process with no Ray connection (the `tandem rollout` CLI) connects, deploys and disconnects
    itself; a deploy failure becomes a RolloutError and the connection is closed either way."""
    import ray

    from gateway import candidate_apps
    from release import serve_deployer

    config = _rollout(tmp_path, candidate="smollm2-135m-instruct@v3")
    gateway = Path(config.deployment.options["gateway_config"])
    gateway.write_text(
        yaml.safe_dump(yaml.safe_load(gateway.read_text()) | {"canary": {"late_candidates": True}})
    )
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(serve_deployer, "_ray_connected", lambda: False)

    def fake_init(address: str, **kwargs: Any) -> None:  # a driver's ray.init takes SIGTERM over
        calls.append(("init", address))
        signal.signal(signal.SIGTERM, lambda number, frame: None)

    own_handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown",)))

    def fake_deploy(config: Any, model: str, draft: str | None, app_name: str) -> list[str]:
        calls.append(("deploy", model, app_name))
        return ["tandem-candidate-standard"]

    monkeypatch.setattr(candidate_apps, "deploy", fake_deploy)
    monkeypatch.setattr(candidate_apps, "remove", lambda config, app_name: calls.append(("remove",)) or [])
    deployer = _deployer(config, FakeDashboard())
    deployer.deploy("candidate", config.candidate)
    deployer.remove("candidate", config.candidate)
    assert calls == [
        ("init", "auto"),
        ("deploy", "smollm2-135m-instruct@v3", "tandem"),
        ("shutdown",),
        ("init", "auto"),
        ("remove",),
        ("shutdown",),
    ]
    assert signal.getsignal(signal.SIGTERM) is own_handler  # the process's own handler is back

    def broken_deploy(*args: Any) -> list[str]:
        raise RuntimeError("replica failed to start: out of memory")

    calls.clear()
    monkeypatch.setattr(candidate_apps, "deploy", broken_deploy)
    with pytest.raises(RolloutError, match=r"deploy candidate applications: RuntimeError: .*out of memory"):
        deployer.deploy("candidate", config.candidate)
    assert calls == [("init", "auto"), ("shutdown",)]
    assert signal.getsignal(signal.SIGTERM) is own_handler


def test_late_candidates_and_a_built_in_slot_are_exclusive() -> None:
    from pydantic import ValidationError

    from gateway.config import CanaryConfig

    with pytest.raises(ValidationError, match="late_candidates"):
        CanaryConfig(model="m@v2", late_candidates=True)


def test_serve_state_comes_from_rays_client_and_an_unreachable_dashboard_is_a_rollout_error(
    tmp_path: Path,
) -> None:
    config = _rollout(tmp_path)
    config.deployment.options["dashboard_url"] = "http://127.0.0.1:9"  # nothing listens on the discard port
    with pytest.raises(RolloutError, match=r"cannot reach the Ray dashboard at http://127\.0\.0\.1:9"):
        ServeDeployer(config).replicas()
