"""The rollout's Prometheus source against real Ray metrics on a two-node Ray cluster (loopback).

A head and a second node are started with ``ray start`` in their own temp dir and ports; one tiny actor on
each node records the gateway's per-release metrics with ``ray.util.metrics`` (as an ingress replica on
that node would). Each node exports only its own workers' metrics, so the source must sum every node's
endpoint; and Ray prefixes application metrics with ``ray_``, which the rollout config's names must carry.
Cleanup kills only the process groups this test started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from release.rollout import MetricsConfig, ReleaseCounters, window_metrics
from release.rollout_controller import PrometheusMetricsSource

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]

RAY = Path(sys.executable).with_name("ray")
# Ray 2.60 turns token auth on for a new head; a loopback test cluster opts out (nodes and driver alike).
ENV = os.environ | {
    "RAY_AUTH_MODE": "disabled",
    "RAY_metrics_report_interval_ms": "500",
    "RAY_USAGE_STATS_ENABLED": "0",
}
START_TIMEOUT_S = 60


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, the process group of one ``ray start --block`` (its own session)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                process.wait(timeout=5)
                return
            process.poll()
            time.sleep(0.2)
    process.wait(timeout=5)


def _wait_for_metrics(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"ray start exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not come up in {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def two_node_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str], Path]]:
    """(GCS address, each node's metrics URL, temp dir) of a head + worker node on loopback."""
    temp = tmp_path_factory.mktemp("ray")
    gcs_port = free_ports(1)[0]
    address = f"127.0.0.1:{gcs_port}"
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for node in ("head", "worker"):
            (metrics, agent_http, agent_grpc, runtime_env, node_manager, object_manager, client) = free_ports(
                7
            )
            argv = [
                str(RAY),
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                f'--resources={{"{node}_node": 1}}',
                f"--metrics-export-port={metrics}",
                f"--dashboard-agent-listen-port={agent_http}",
                f"--dashboard-agent-grpc-port={agent_grpc}",
                f"--runtime-env-agent-port={runtime_env}",
                f"--node-manager-port={node_manager}",
                f"--object-manager-port={object_manager}",
                "--min-worker-port=0",
                "--max-worker-port=0",
            ]  # worker ports 0: the OS picks them, so two raylets on one host never collide
            if node == "head":
                argv += [
                    "--head",
                    f"--port={gcs_port}",
                    f"--temp-dir={temp}",
                    f"--ray-client-server-port={client}",
                    "--include-dashboard=false",
                ]
            else:
                argv += [f"--address={address}"]
            log = temp / f"{node}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                           start_new_session=True)  # fmt: skip
            processes.append(process)
            urls.append(f"http://127.0.0.1:{metrics}/metrics")
            _wait_for_metrics(urls[-1], process, log)
        yield address, urls, temp
    finally:
        for process in reversed(processes):
            _stop(process)


DRIVER = textwrap.dedent(
    """
    import sys, time
    import ray
    from ray.util import metrics

    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self):
            self.requests = metrics.Counter("tandem_requests_total", tag_keys=("release",))
            self.errors = metrics.Counter("tandem_request_errors_total", tag_keys=("release",))
            self.ttft = metrics.Histogram("tandem_time_to_first_token_seconds", boundaries=[0.1, 0.5, 1.0, 2.5],
                                          tag_keys=("release",))

        def serve(self, release, n, errors, ttft):
            for i in range(n):
                self.requests.inc(1, {"release": release})
                self.ttft.observe(ttft, {"release": release})
            if errors:
                self.errors.inc(errors, {"release": release})
            return ray.get_runtime_context().get_node_id()

    ray.init(address=sys.argv[1], logging_level="ERROR")
    head = Replica.options(resources={"head_node": 0.01}).remote()
    worker = Replica.options(resources={"worker_node": 0.01}).remote()
    nodes = ray.get([head.serve.remote("stable", 30, 0, 0.2), worker.serve.remote("stable", 50, 1, 0.2),
                     worker.serve.remote("candidate", 20, 4, 2.0)])
    assert nodes[0] != nodes[1], nodes
    print("served", flush=True)
    time.sleep(float(sys.argv[2]))  # keep the actors (and their metrics) alive while the test scrapes
    """
)


def test_prometheus_source_sums_ray_metrics_over_both_nodes(
    two_node_ray: tuple[str, list[str], Path],
) -> None:
    address, urls, temp = two_node_ray
    script = temp / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), address, "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=ENV, start_new_session=True)  # fmt: skip
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline().decode()
        if line.strip() != "served":
            pytest.fail(f"driver failed: {line}{driver.stdout.read().decode()[-4000:]}")

        # Ray exports application metrics with a `ray_` prefix; each node only its own workers'.
        config = MetricsConfig(urls=urls)  # the default names are Ray's exported ones
        source = PrometheusMetricsSource(config)
        deadline, snapshot = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            snapshot = source.snapshot()
            if snapshot.releases["stable"].requests >= 80 and snapshot.releases["candidate"].requests >= 20:
                break
            time.sleep(0.5)
        assert snapshot is not None
        stable, candidate = snapshot.releases["stable"], snapshot.releases["candidate"]
        assert (stable.requests, stable.errors) == (80, 1)  # 30 on the head + 50 on the worker node
        assert (candidate.requests, candidate.errors) == (20, 4)

        head_only = PrometheusMetricsSource(config.model_copy(update={"urls": urls[:1]})).snapshot()
        assert head_only.releases["stable"].requests == 30 and head_only.releases["candidate"].requests == 0

        window = window_metrics(ReleaseCounters(), candidate)  # everything since the cluster started
        assert window.error_rate == pytest.approx(0.2)
        assert window.p99_ttft_seconds is not None and 1.0 < window.p99_ttft_seconds <= 2.5
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        driver.wait(timeout=10)
