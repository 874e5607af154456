"""Start and stop the whole gateway: Ray, the Serve application, and readiness."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gateway.app import build_gateway_app, prepare_release, tier_routes
from gateway.config import TandemConfig
from gateway.ingress import TierRoute
from infra.errors import TandemError
from infra.lifecycle import init_ray

log = logging.getLogger(__name__)

APP_NAME = "tandem"


class ServeStartError(TandemError):
    """The Serve application did not become ready."""


@dataclass
class RunningGateway:
    base_url: str
    routes: list[TierRoute]

    @property
    def openai_url(self) -> str:
        return f"{self.base_url}/v1"


def start_gateway(
    config: TandemConfig,
    *,
    timeout_s: float = 900.0,
    on_progress: Callable[[str], None] | None = None,
) -> RunningGateway:
    """Prepare the release, start (or join) Ray, deploy both tiers and wait until ``/health`` is 200."""
    import ray
    from ray import serve

    progress = on_progress or (lambda message: log.info("event=serve_progress message=%r", message))
    progress("preparing model artifacts")
    resolved = prepare_release(config)
    progress("starting Ray")
    # A candidate slot is scaled in place by the rollout deployer (release.serve_deployer.ServeDeployer) through
    # the dashboard's scale endpoint, which Serve opens only to applications run with an external scaler.
    in_place_rollout = bool(config.canary.model) or config.canary.late_candidates
    if not ray.is_initialized():
        if config.ray.address:
            init_ray(address=config.ray.address, log_to_driver=False)
        else:
            init_ray(num_cpus=config.ray.num_cpus, include_dashboard=in_place_rollout, log_to_driver=False)
    serve.start(http_options={"host": config.server.host, "port": config.server.port})
    app = build_gateway_app(config, resolved)
    progress("deploying tiers (engines load the weights)")
    started = time.monotonic()
    # serve.run waits for the deployments; run it aside so this thread can report their progress.
    failure: list[BaseException] = []

    def deploy() -> None:
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", external_scaler_enabled=in_place_rollout)
        except BaseException as exc:
            failure.append(exc)

    threading.Thread(target=deploy, name="serve-deploy", daemon=True).start()
    host = "127.0.0.1" if config.server.host in ("0.0.0.0", "::") else config.server.host
    base_url = f"http://{host}:{config.server.port}"
    _wait_ready(base_url, started + timeout_s, progress, failure)
    return RunningGateway(base_url=base_url, routes=tier_routes(resolved))


def _wait_ready(
    base_url: str, deadline: float, progress: Callable[[str], None], failure: list[BaseException]
) -> None:
    from ray import serve

    last = ""
    while time.monotonic() < deadline:
        if failure:
            raise ServeStartError(f"the Serve application failed to deploy: {failure[0]}") from failure[0]
        status = serve.status().applications.get(APP_NAME)
        if status is not None:
            state = str(status.status.value if hasattr(status.status, "value") else status.status)
            if state in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise ServeStartError(f"the Serve application failed to deploy: {status.message}")
            deployments = ", ".join(
                f"{name}={getattr(d.status, 'value', d.status)}" for name, d in status.deployments.items()
            )
            if deployments != last:
                progress(deployments)
                last = deployments
            if state == "RUNNING":
                try:
                    if httpx.get(f"{base_url}/health", timeout=15).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
        time.sleep(1.0)
    raise ServeStartError(f"the gateway was not ready at {base_url} before the timeout")


def stop_gateway() -> None:
    """Shut the Serve application and the Ray runtime this process started."""
    import ray
    from ray import serve

    if ray.is_initialized():
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
