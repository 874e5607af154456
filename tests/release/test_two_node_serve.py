"""`tandem serve` deployed across a two-node Ray cluster on loopback: a head and a second node, each started
with ``ray start`` in a private temp dir, ports and environment.

The head has 1 CPU and the second node 2. The standard tier's engine bundle takes 2 (its CPU plus the replica
actor's, which Ray Serve LLM adds to the first bundle), so the engine replica fits only on the second node;
the ingress (1 CPU) is placed while the head is the only node, so it runs there. A chat answered through the
gateway then crosses both nodes, and Serve's own record of its replicas (the head's dashboard) must show the
application RUNNING on both. Cleanup stops every process group the test started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.tiny_model import build_tiny_llama
from gateway.canary import deployment_name
from gateway.server import APP_NAME
from tests.conftest import REPO, _tail
from tests.release.test_rollout_ray_metrics import RAY, _stop, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_TIMEOUT_S = 600
ENGINE_CPUS = 1
BUNDLE_CPUS = ENGINE_CPUS + 1  # Ray Serve LLM adds the replica actor's 1 CPU to the engine's first bundle
ENGINE_DEPLOYMENT = deployment_name("tandem-standard")


@dataclass
class TwoNodeCluster:
    address: str
    dashboard_url: str
    work: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]]

    def start_node(self, name: str, num_cpus: int, extra: list[str]) -> subprocess.Popen[bytes]:
        """``ray start --block`` for one node in its own session, on ports of its own."""
        (metrics, agent_http, agent_grpc, runtime_env, node_manager, object_manager) = free_ports(6)
        argv = [
            str(RAY), "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
            f'--resources={{"{name}_node": 1}}', f"--metrics-export-port={metrics}",
            f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={node_manager}",
            f"--object-manager-port={object_manager}",
            "--min-worker-port=0", "--max-worker-port=0",  # the OS picks: two raylets on one host never collide
            *extra,
        ]  # fmt: skip
        with (self.work / f"ray-{name}.log").open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                       start_new_session=True)  # fmt: skip
        self.processes.append(process)
        return process

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.dashboard_url}{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def nodes(self) -> dict[str, str]:
        """Alive node name ('head', 'worker', from each node's custom resource) -> Ray node id."""
        found = self.get("/api/v0/nodes?detail=true")["data"]["result"]["result"]
        return {
            name.removesuffix("_node"): node["node_id"]
            for node in found
            if node["state"] == "ALIVE"
            for name in node["resources_total"]
            if name in ("head_node", "worker_node")
        }

    def application(self) -> dict[str, Any] | None:
        applications: dict[str, Any] = self.get("/api/serve/applications/").get("applications", {})
        return applications.get(APP_NAME)


def _wait(what: str, ready: Callable[[], bool], watched: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """Poll ``ready`` until true; fail with the logs if a watched process exits or the time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for process, log in watched:
            if process.poll() is not None:
                pytest.fail(
                    f"{what}: the process logging to {log.name} exited with {process.returncode}:\n{_tail(log)}"
                )
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"{what}: not within {START_TIMEOUT_S}s:\n" + "\n".join(_tail(log) for _, log in watched)
            )
        time.sleep(1)


@pytest.fixture
def ray_head() -> Iterator[TwoNodeCluster]:
    """A Ray head (1 CPU, dashboard on) on loopback; the test adds the second node. Every node it started
    is stopped at the end."""
    work = Path(tempfile.mkdtemp(prefix="tn-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    gcs_port, dashboard_port, client_port = free_ports(3)
    env = os.environ | {
        "RAY_AUTH_MODE": "disabled",  # Ray 2.60 turns token auth on for a new head; loopback opts out
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",  # Ray nices its workers to 15: the engine starves on a shared machine
        "TANDEM_HOME": str(work / "home"),
    }
    cluster = TwoNodeCluster(
        f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dashboard_port}", work, env, processes=[]
    )
    try:
        head = cluster.start_node("head", 1, [
            "--head", f"--port={gcs_port}", f"--temp-dir={work / 'ray'}", f"--ray-client-server-port={client_port}",
            "--include-dashboard=true", f"--dashboard-port={dashboard_port}",
        ])  # fmt: skip
        _wait("the Ray head", lambda: "head" in cluster.nodes(), [(head, work / "ray-head.log")])
        yield cluster
    finally:
        for process in reversed(cluster.processes):
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def tandem_serve(cluster: TwoNodeCluster, config: dict[str, Any]) -> Iterator[subprocess.Popen[bytes]]:
    """`tandem serve --config` joined to the cluster; SIGINT (Serve shuts its application down), then kill."""
    config_path = cluster.work / "tandem.yaml"
    config_path.write_text(yaml.safe_dump(config))
    with (cluster.work / "serve.log").open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--config", str(config_path)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=cluster.env, start_new_session=True,
        )  # fmt: skip
    try:
        yield serve
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.pid, signal.SIGKILL)
        serve.wait(timeout=30)


def _replica_nodes(application: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Deployment -> (state, node id) of each of its replicas."""
    return {
        name: [(replica["state"], replica.get("node_id") or "") for replica in deployment.get("replicas", [])]
        for name, deployment in application["deployments"].items()
    }


def test_application_is_deployed_across_head_and_second_node(ray_head: TwoNodeCluster) -> None:
    cluster = ray_head
    port = free_ports(1)[0]
    model = build_tiny_llama(cluster.work / "tiny-llama")
    config = {
        "registry": f"file://{cluster.work / 'registry'}",
        "model": str(model),
        "engine": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.05,
                   "max_num_seqs": 4, "enforce_eager": True},
        "tiers": [{"name": "standard", "model_id": "tandem-standard", "aliases": ["standard"],
                   "num_cpus": ENGINE_CPUS}],
        "canary": {"weights_file": str(cluster.work / "weights.json")},
        "server": {"host": "127.0.0.1", "port": port},
        "ray": {"address": cluster.address},
    }  # fmt: skip
    head_log, serve_log = cluster.work / "ray-head.log", cluster.work / "serve.log"
    with tandem_serve(cluster, config) as serve:
        watched = [(cluster.processes[0], head_log), (serve, serve_log)]

        def ingress_placed() -> bool:
            application = cluster.application()
            return application is not None and any(
                state == "RUNNING" and node
                for name, replicas in _replica_nodes(application).items()
                if name != ENGINE_DEPLOYMENT
                for state, node in replicas
            )

        # Serve spreads the ingress over any node with a free CPU; placed while the head is alone, it runs
        # there, and the engine's bundle (more CPUs than the head has) waits for the second node.
        _wait("the ingress replica on the head", ingress_placed, watched)
        worker = cluster.start_node("worker", BUNDLE_CPUS, [f"--address={cluster.address}"])
        watched.append((worker, cluster.work / "ray-worker.log"))
        base_url = f"http://127.0.0.1:{port}"
        _wait("tandem serve /health", lambda: httpx.get(f"{base_url}/health", timeout=15).status_code == 200,
              watched)  # fmt: skip

        response = httpx.post(
            f"{base_url}/v1/chat/completions",
            json={"model": "standard", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]

        nodes = cluster.nodes()
        application = cluster.application()
        assert application is not None
        replicas = _replica_nodes(application)
    print("nodes:", nodes, "replicas:", replicas)
    assert set(nodes) == {"head", "worker"} and nodes["head"] != nodes["worker"]
    assert application["status"] == "RUNNING", application.get("message")
    assert all(d["status"] == "HEALTHY" for d in application["deployments"].values()), application
    assert ENGINE_DEPLOYMENT in replicas and len(replicas) == 2, replicas
    assert all(state == "RUNNING" for replicas_of in replicas.values() for state, _ in replicas_of), replicas
    assert [node for _, node in replicas[ENGINE_DEPLOYMENT]] == [nodes["worker"]]
    ingress = [node for name, of in replicas.items() if name != ENGINE_DEPLOYMENT for _, node in of]
    assert ingress == [nodes["head"]]
    assert {node for of in replicas.values() for _, node in of} == {nodes["head"], nodes["worker"]}
