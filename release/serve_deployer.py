"""The rollout deployer that changes a running ``tandem serve`` application in place."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.app import candidate_tiers
from gateway.canary import deployment_name
from gateway.config import load_config
from gateway.traffic import ReleaseName, ReleaseSpec
from infra.config import describe_validation_error
from infra.errors import ConfigError, RolloutError, TandemError
from infra.lifecycle import init_ray, keep_signal_handlers
from release.rollout import RolloutConfig

log = logging.getLogger(__name__)


class ServeDeployerOptions(BaseModel):
    """``deployment.options`` of a rollout that uses ``deployer: release.serve_deployer:ServeDeployer``."""

    model_config = ConfigDict(extra="forbid")

    gateway_config: Path = Field(
        description="The TandemConfig YAML the running `tandem serve` was started with."
    )
    dashboard_url: str = Field("http://127.0.0.1:8265", description="Ray dashboard of the gateway's cluster.")
    app_name: str = Field("tandem", description="Serve application name (`tandem serve` uses 'tandem').")
    auth_token_file: Path | None = Field(
        None,
        description="Ray's token for the dashboard API when token auth is on (Ray 2.60's default for `ray start`); "
        "default: $RAY_AUTH_TOKEN, else $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token when present.",
    )
    timeout_seconds: float = Field(600, gt=0, description="Most time a scale-up may take to serve.")
    poll_seconds: float = Field(1.0, gt=0, description="How often Serve's state is read while scaling.")


def _ray_connected() -> bool:
    import ray

    return bool(ray.is_initialized())


class ServeDeployer:
    """Deploys and removes a release's tiers *inside* the running Serve application, in place.

    Serve 2.60 versions every deployment of an application from its code and arguments: re-running
    ``serve.run`` gives each deployment a fresh random version and a config deploy hashes the args, so
    adding a deployment either way restarts every replica, stable engines included. What it does change in
    place is a deployment's replica count. So ``tandem serve`` with ``canary.model`` builds the candidate's
    tiers into the application at start (Serve refuses a deployment of 0 replicas there) under an external
    scaler, and this deployer scales a release's tiers through the dashboard's ``.../deployments/{name}/scale``
    endpoint: ``deploy`` to the tiers' configured replicas, waiting until they run; ``remove`` to 0 replicas.
    Other deployments are never touched.

    A gateway started with ``canary.late_candidates`` (and no ``canary.model``) takes any candidate later:
    ``deploy`` runs the candidate's tiers as Serve applications of their own (``tandem-candidate-<tier>``,
    via ``python -m gateway.candidate_apps`` in a child process), which the ingress reaches by deployment
    handle, and ``remove`` deletes them; the stable tiers are still scaled in place.
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        serve_client: Any | None = None,
    ) -> None:
        try:
            self.options = ServeDeployerOptions.model_validate(rollout.deployment.options)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "rollout deployment.options")) from exc
        self.gateway = load_config(self.options.gateway_config)
        serving = sorted({tier.model for tier in self.gateway.tiers})
        if rollout.stable.model not in serving:
            # After a promotion the candidate serves everything and the gateway's stable tiers are at 0: the next
            # rollout starts from a gateway restarted with the promoted weights as its stable model.
            raise RolloutError(
                f"the rollout's stable release {rollout.stable.model!r} is not what the gateway "
                f"({self.options.gateway_config}) serves as stable ({', '.join(serving)}): restart `tandem "
                "serve` with `model:` set to the stable release first"
            )
        # Without a built-in slot, the candidate gets its own Serve applications (canary.late_candidates).
        self.late = self.gateway.canary.model is None and self.gateway.canary.late_candidates
        if not self.late and self.gateway.canary.model != rollout.candidate.model:
            raise RolloutError(
                f"the gateway ({self.options.gateway_config}) has a candidate slot for "
                f"{self.gateway.canary.model!r}, not {rollout.candidate.model!r}: start `tandem serve` with "
                "canary.model set to the candidate, or with canary.late_candidates to take any candidate "
                "later (Serve restarts every replica of an application whose arguments change, so a new "
                "candidate cannot be added to a running one in place)"
            )
        # Serve's state comes from Ray's ServeSubmissionClient (connected on first use); it has no call for
        # the dashboard's scale endpoint (Ray 2.60), so that one POST goes through this client.
        self._serve_client = serve_client
        self.http = httpx.Client(
            base_url=self.options.dashboard_url.rstrip("/"),
            timeout=30,
            headers=self._auth_headers(),
            transport=transport,
        )

    def _auth_headers(self) -> dict[str, str]:
        token = os.environ.get("RAY_AUTH_TOKEN")
        path = self.options.auth_token_file or Path(
            os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
        )
        if not token and path.is_file():
            token = path.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _tiers(self, release: ReleaseName) -> dict[str, int]:
        """Deployment name -> configured replicas of each of the release's tiers."""
        stable = {tier.model_id: tier.replicas for tier in self.gateway.tiers}
        tiers = (
            stable if release == "stable" else {t.model_id: t.replicas for t in candidate_tiers(self.gateway)}
        )
        return {deployment_name(model_id): replicas for model_id, replicas in tiers.items()}

    def deploy(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        """Scale the release's tiers to their configured replicas; return once every replica runs."""
        if release == "candidate" and self.late:
            self._candidate_apps("deploy", spec)
            return
        self._scale(release, self._tiers(release))

    def remove(self, release: ReleaseName, spec: ReleaseSpec) -> None:
        """Scale the release's tiers to 0 replicas (Serve drains their in-flight requests first)."""
        if release == "candidate" and self.late:
            self._candidate_apps("remove", spec)
            return
        self._scale(release, dict.fromkeys(self._tiers(release), 0))

    def _candidate_apps(self, action: str, spec: ReleaseSpec) -> None:
        """Deploy or delete a late candidate's applications: as a Ray driver of this process when it has no
        Ray connection (connect, deploy, disconnect), else from a child process, so a driver already
        connected to some other cluster is never redirected."""
        if _ray_connected():
            self._candidate_apps_in_child(action, spec)
            return
        import ray

        from gateway import candidate_apps

        started = time.monotonic()
        # ray.shutdown below leaves Ray's SIGTERM handler too, so the whole block keeps the caller's.
        with keep_signal_handlers():
            init_ray(address=self.gateway.ray.address or "auto", log_to_driver=False)
            try:
                if action == "deploy":
                    names = candidate_apps.deploy(self.gateway, spec.model, spec.draft, self.options.app_name)
                else:
                    names = candidate_apps.remove(self.gateway, self.options.app_name)
            except TandemError:
                raise
            except Exception as exc:  # Serve's deploy failures carry the replica's error
                raise RolloutError(f"{action} candidate applications: {type(exc).__name__}: {exc}") from exc
            finally:
                ray.shutdown()
        log.info(
            "event=candidate_apps action=%s applications=%s seconds=%.1f",
            action,
            " ".join(names),
            time.monotonic() - started,
        )

    def _candidate_apps_in_child(self, action: str, spec: ReleaseSpec) -> None:
        argv = [sys.executable, "-m", "gateway.candidate_apps", action]
        argv += ["--gateway-config", str(self.options.gateway_config), "--app-name", self.options.app_name]
        if action == "deploy":
            argv += ["--model", spec.model] + (["--draft", spec.draft] if spec.draft else [])
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.options.timeout_seconds)
        except subprocess.TimeoutExpired as exc:
            raise RolloutError(f"{action} candidate applications: no result in {exc.timeout:g}s") from exc
        if done.returncode != 0:
            raise RolloutError(
                f"{action} candidate applications: exit {done.returncode}: {done.stderr[-800:]}"
            )
        log.info(
            "event=candidate_apps action=%s applications=%s seconds=%.1f",
            action,
            done.stdout.strip(),
            time.monotonic() - started,
        )
        for line in done.stderr.splitlines()[-40:]:  # the child's own progress (Serve's deploy messages)
            if not line.startswith("{"):
                log.info("event=candidate_apps_output line=%r", line[:300])

    def application(self, app_name: str | None = None) -> dict[str, Any]:
        """Serve's details of one application (default: the gateway's): ``last_deployed_time_s``, ``status``,
        ``deployments`` with their replicas."""
        app_name = app_name or self.options.app_name
        try:
            details = self._serve().get_serve_details()
        except RolloutError:
            raise
        except (
            Exception
        ) as exc:  # the client raises requests' errors, Ray's AuthenticationError, RuntimeError
            raise RolloutError(f"cannot read Serve's state from {self.options.dashboard_url}: {exc}") from exc
        application = details.get("applications", {}).get(app_name)
        if application is None:
            raise RolloutError(f"no Serve application {app_name!r} at {self.options.dashboard_url}")
        return dict(application)

    def replicas(self, app_name: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Every deployment of the application (default: the gateway's) -> its replicas (``replica_id``,
        ``actor_id``, ``pid``, ``state``)."""
        application = self.application(app_name)
        return {name: d.get("replicas", []) for name, d in application["deployments"].items()}

    def _serve(self) -> Any:
        """Ray's dashboard client for Serve's applications, connected on first use."""
        if self._serve_client is None:
            from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

            try:
                self._serve_client = ServeSubmissionClient(
                    self.options.dashboard_url.rstrip("/"), headers=self._auth_headers()
                )
            except Exception as exc:  # it checks the connection and Ray's version when it is built
                raise RolloutError(
                    f"cannot reach the Ray dashboard at {self.options.dashboard_url}: {exc}"
                ) from exc
        return self._serve_client

    def _scale(self, release: ReleaseName, targets: dict[str, int]) -> None:
        app = self.options.app_name
        for name, count in targets.items():
            try:
                response = self.http.post(
                    f"/api/v1/applications/{app}/deployments/{name}/scale",
                    json={"target_num_replicas": count},
                )
            except httpx.HTTPError as exc:
                raise RolloutError(f"scale {name} to {count}: {exc}") from exc
            if response.status_code != 200:
                raise RolloutError(
                    f"scale {name} to {count}: HTTP {response.status_code}: {response.text[:300]}"
                )
            log.info("event=serve_scale release=%s deployment=%s replicas=%d", release, name, count)
        deadline = time.monotonic() + self.options.timeout_seconds
        while True:
            replicas = self.replicas()
            # Done when each deployment has exactly its target, all RUNNING (stopping ones still count).
            pending = {
                name: f"{sum(r.get('state') == 'RUNNING' for r in replicas.get(name, []))}/{count} running, "
                f"{len(replicas.get(name, []))} listed"
                for name, count in targets.items()
                if [r.get("state") for r in replicas.get(name, [])] != ["RUNNING"] * count
            }
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RolloutError(f"{release} tiers did not reach their replica counts in time: {pending}")
            time.sleep(self.options.poll_seconds)
