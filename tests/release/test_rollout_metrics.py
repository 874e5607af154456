"""Window metrics from Prometheus text: a real scrape of a local HTTP server, quantiles, counter resets.

Also drives the real adapters end to end (``tandem rollout start`` over a weights file and a scraped
``/metrics``), with a small server that plays a gateway splitting traffic by the published weights.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gateway.release_metrics import Histogram, histogram_quantile
from gateway.traffic import ReleaseSpec, assign_release, load_traffic_weights
from infra.errors import RolloutError
from release.rollout import MetricsConfig, ReleaseCounters, window_metrics
from release.rollout_cli import rollout_app
from release.rollout_controller import (
    CommandDeployer,
    FileTrafficSplitter,
    PrometheusMetricsSource,
    load_state,
)

BOUNDS = ["0.1", "0.5", "1.0", "2.5", "+Inf"]


class SimulatedGateway:
    """Per (release, tier) counters rendered as the gateway's Prometheus text, plus vLLM engine counters."""

    def __init__(self, weights_file: Path | None = None, candidate_errors: float = 0.0) -> None:
        self.weights_file = weights_file
        self.candidate_errors = candidate_errors
        self.series: dict[tuple[str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()

    def serve(
        self, release: str, tier: str, n: int, errors: int, ttft: float, tpot: float, accept: float
    ) -> None:
        with self.lock:
            s = self.series.setdefault((release, tier), {"req": 0, "err": 0, "ttft": {b: 0 for b in BOUNDS},
                                                         "ttft_sum": 0.0, "tpot_sum": 0.0, "tpot_n": 0,
                                                         "drafted": 0, "accepted": 0})  # fmt: skip
            s["req"] += n
            s["err"] += errors
            for bound in BOUNDS:
                if float(bound) >= ttft:
                    s["ttft"][bound] += n
            s["ttft_sum"] += ttft * n
            s["tpot_sum"] += tpot * n * 10
            s["tpot_n"] += n * 10
            if tier == "fast":
                s["drafted"] += n * 30
                s["accepted"] += round(n * 30 * accept)

    def render(self) -> str:
        if self.weights_file is not None and self.weights_file.is_file():
            weights = json.loads(self.weights_file.read_text())
            for release in ("stable", "candidate"):
                n = weights[release]  # 100 requests per scrape, split by the published weights
                bad = round(n * self.candidate_errors) if release == "candidate" else 0
                self.serve(release, "standard", n, bad, 0.3, 0.02, 0.0)
        lines = [
            "# HELP ray_tandem_requests_total Finished requests.",
            "# TYPE ray_tandem_requests_total counter",
            "# TYPE ray_tandem_request_errors_total counter",
            "# TYPE ray_tandem_time_to_first_token_seconds histogram",
            "# TYPE ray_tandem_time_per_output_token_seconds histogram",
            "# TYPE ray_vllm_spec_decode_num_draft_tokens_total counter",
            "# TYPE ray_vllm_spec_decode_num_accepted_tokens_total counter",
            "# TYPE unrelated_gauge gauge",
            'unrelated_gauge{release="candidate"} 12345',
        ]
        with self.lock:
            for (release, tier), s in sorted(self.series.items()):
                labels = f'release="{release}",tier="{tier}"'
                lines += [f"ray_tandem_requests_total{{{labels}}} {s['req']}",
                          f"ray_tandem_request_errors_total{{{labels}}} {s['err']}"]  # fmt: skip
                lines += [f'ray_tandem_time_to_first_token_seconds_bucket{{{labels},le="{b}"}} {s["ttft"][b]}'
                          for b in BOUNDS]  # fmt: skip
                lines += [f"ray_tandem_time_to_first_token_seconds_sum{{{labels}}} {s['ttft_sum']}",
                          f"ray_tandem_time_to_first_token_seconds_count{{{labels}}} {s['req']}",
                          f'ray_tandem_time_per_output_token_seconds_bucket{{{labels},le="+Inf"}} {s["tpot_n"]}',
                          f"ray_tandem_time_per_output_token_seconds_sum{{{labels}}} {s['tpot_sum']}",
                          f"ray_tandem_time_per_output_token_seconds_count{{{labels}}} {s['tpot_n']}"]  # fmt: skip
                if tier == "fast":
                    model = "tandem-fast" if release == "stable" else "tandem-fast-candidate"
                    lines += [f'ray_vllm_spec_decode_num_draft_tokens_total{{model_name="{model}"}} {s["drafted"]}',
                              f'ray_vllm_spec_decode_num_accepted_tokens_total{{model_name="{model}"}} {s["accepted"]}']  # fmt: skip
        return "\n".join(lines) + "\n"


@pytest.fixture
def gateway_server() -> Iterator[tuple[SimulatedGateway, str]]:
    gateway = SimulatedGateway()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = server.gateway.render().encode()  # type: ignore[attr-defined]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.gateway = gateway  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield gateway, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    histogram = Histogram(buckets={"0.1": 50, "0.5": 90, "1.0": 100, "+Inf": 100}, sum=20, count=100)
    assert histogram_quantile(0.5, histogram) == pytest.approx(0.1)
    assert histogram_quantile(0.7, histogram) == pytest.approx(0.1 + 0.4 * 20 / 40)
    assert histogram_quantile(0.99, histogram) == pytest.approx(0.5 + 0.5 * 9 / 10)
    tail = Histogram(buckets={"0.1": 10, "+Inf": 100}, sum=500, count=100)
    assert histogram_quantile(0.99, tail) == pytest.approx(0.1)  # beyond the last finite bucket
    assert histogram_quantile(0.99, Histogram()) is None


def test_window_metrics_are_deltas_and_survive_a_counter_reset() -> None:
    start = ReleaseCounters(requests=1000, errors=10, drafted_tokens=3000, accepted_tokens=2000)
    end = ReleaseCounters(requests=1100, errors=15, drafted_tokens=3600, accepted_tokens=2450)
    window = window_metrics(start, end)
    assert (window.requests, window.errors, window.error_rate) == (100, 5, pytest.approx(0.05))
    assert window.acceptance_rate == pytest.approx(450 / 600)
    restarted = ReleaseCounters(requests=40, errors=2)  # the gateway restarted: counters began again
    assert window_metrics(end, restarted).requests == 40


def test_prometheus_source_scrapes_per_release_windows(gateway_server: tuple[SimulatedGateway, str]) -> None:
    gateway, url = gateway_server
    config = MetricsConfig(
        urls=url,
        acceptance_selectors={"stable": {"model_name": "tandem-fast"},
                              "candidate": {"model_name": "tandem-fast-candidate"}},
    )  # fmt: skip
    source = PrometheusMetricsSource(config, clock=lambda: 123.0)
    gateway.serve("stable", "standard", 500, 1, 0.3, 0.02, 0.0)
    gateway.serve("candidate", "standard", 50, 0, 0.3, 0.02, 0.0)
    before = source.snapshot()
    assert before.taken_at == 123.0 and before.releases["stable"].requests == 500

    gateway.serve("stable", "standard", 600, 3, 0.3, 0.02, 0.0)
    gateway.serve("stable", "fast", 300, 0, 0.3, 0.01, 0.8)
    gateway.serve("candidate", "standard", 90, 9, 2.0, 0.05, 0.0)
    gateway.serve("candidate", "fast", 10, 1, 2.0, 0.03, 0.5)
    after = source.snapshot()
    stable = window_metrics(before.releases["stable"], after.releases["stable"])
    candidate = window_metrics(before.releases["candidate"], after.releases["candidate"])

    assert (stable.requests, stable.errors) == (900, 3)  # summed over the tier label
    assert (candidate.requests, candidate.errors, candidate.error_rate) == (100, 10, pytest.approx(0.1))
    assert stable.p99_ttft_seconds is not None and stable.p99_ttft_seconds <= 0.5
    assert candidate.p99_ttft_seconds == pytest.approx(1.0 + 1.5 * (99 - 0) / 100)  # inside (1.0, 2.5]
    assert candidate.time_per_output_token_seconds == pytest.approx((90 * 0.05 + 10 * 0.03) / 100)
    assert stable.acceptance_rate == pytest.approx(0.8) and candidate.acceptance_rate == pytest.approx(0.5)


def test_prometheus_source_sums_several_endpoints(gateway_server: tuple[SimulatedGateway, str]) -> None:
    gateway, url = gateway_server
    gateway.serve("candidate", "standard", 70, 7, 0.3, 0.02, 0.0)
    one = PrometheusMetricsSource(MetricsConfig(urls=url)).snapshot().releases["candidate"]
    both = PrometheusMetricsSource(MetricsConfig(urls=[url, url])).snapshot().releases["candidate"]
    assert (one.requests, both.requests, both.errors, both.ttft.count) == (70, 140, 14, 140)


def test_prometheus_source_errors_name_the_url(gateway_server: tuple[SimulatedGateway, str]) -> None:
    _, url = gateway_server
    with pytest.raises(RolloutError, match=r"cannot scrape .*/nope"):
        PrometheusMetricsSource(MetricsConfig(urls=[url, url.replace("/metrics", "/nope")])).snapshot()


def test_file_splitter_and_command_deployer(tmp_path: Path) -> None:
    releases = {"stable": ReleaseSpec(model="m@v1"), "candidate": ReleaseSpec(model="m@v2", draft="d@v2")}
    splitter = FileTrafficSplitter(tmp_path / "w" / "weights.json", "salt-1", releases)  # type: ignore[arg-type]
    assert load_traffic_weights(splitter.path).candidate == 0  # nothing published yet: all on stable
    splitter.set_weights({"stable": 90, "candidate": 10})
    published = load_traffic_weights(splitter.path)
    assert (published.stable, published.candidate, published.salt) == (90, 10, "salt-1")
    assert published.releases["candidate"] == ReleaseSpec(model="m@v2", draft="d@v2")
    keys = [f"key-{i}" for i in range(200)]
    assert [published.release_for(k) for k in keys] == [assign_release(k, 10, "salt-1") for k in keys]
    splitter.path.write_text('{"stable": 90, "candidate": 20}')
    with pytest.raises(RolloutError, match="must be 100"):
        load_traffic_weights(splitter.path)

    log = tmp_path / "deploy.log"
    deployer = CommandDeployer(["sh", "-c", f"echo deploy {{release}} {{model}} {{draft}} >> {log}"],
                               ["sh", "-c", "echo cannot remove {release} >&2; exit 3"])  # fmt: skip
    deployer.deploy("candidate", releases["candidate"])
    assert log.read_text() == "deploy candidate m@v2 d@v2\n"
    with pytest.raises(RolloutError, match="remove stable: exit 3: cannot remove stable"):
        deployer.remove("stable", releases["stable"])
    CommandDeployer(None, None).deploy("candidate", releases["candidate"])  # managed outside: a no-op


def _cli_config(tmp_path: Path, url: str, verdict: str = "PASS") -> Path:
    (tmp_path / "gate-report.md").write_text(f"# Release gate: {verdict}\n")
    data = {
        "name": "cli-demo",
        "stable": {"model": "m@v1"},
        "candidate": {"model": "m@v2"},
        "gate": {"path": str(tmp_path / "gate-report.md")},
        "steps": [{"weight": 10, "min_requests": 15}, {"weight": 50, "min_requests": 60}, {"weight": 100}],
        "analysis": {"error_rate": {"max": 0.05}},
        "rollback": {"min_requests": 10, "drain_seconds": 0},
        "traffic": {"salt": "s", "weights_file": str(tmp_path / "weights.json")},
        "metrics": {"urls": [url]},
        "deployment": {"deploy": ["sh", "-c", f"echo deploy {{release}} >> {tmp_path / 'deploy.log'}"],
                       "remove": ["sh", "-c", f"echo remove {{release}} >> {tmp_path / 'deploy.log'}"]},
    }  # fmt: skip
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_start_status_and_promotion_over_http(
    tmp_path: Path, gateway_server: tuple[SimulatedGateway, str]
) -> None:
    gateway, url = gateway_server
    gateway.weights_file = tmp_path / "weights.json"
    config, state_dir = _cli_config(tmp_path, url), tmp_path / "state"
    registry = f"file://{tmp_path / 'registry'}"
    common = ["--config", str(config), "--state-dir", str(state_dir), "--registry", registry]
    runner = CliRunner()

    result = runner.invoke(rollout_app, ["start", *common, "--poll-interval", "0.1", "--max-ticks", "2"])
    assert result.exit_code == 0, result.output
    state = load_state(state_dir)
    assert state is not None and state.phase.value == "running"

    result = runner.invoke(rollout_app, ["status", "--state-dir", str(state_dir)])
    assert result.exit_code == 0 and "running" in result.output and "gate_passed" in result.output

    result = runner.invoke(rollout_app, ["start", *common, "--poll-interval", "0.05"])
    assert result.exit_code == 0, result.output
    assert "promoted" in result.output
    assert json.loads((tmp_path / "weights.json").read_text())["candidate"] == 100
    assert (tmp_path / "deploy.log").read_text() == "deploy candidate\nremove stable\n"


def test_cli_abort_rolls_back_and_bad_candidate_exits_1(
    tmp_path: Path, gateway_server: tuple[SimulatedGateway, str]
) -> None:
    gateway, url = gateway_server
    gateway.weights_file = tmp_path / "weights.json"
    config, state_dir = _cli_config(tmp_path, url), tmp_path / "state"
    common = [
        "--config",
        str(config),
        "--state-dir",
        str(state_dir),
        "--registry",
        f"file://{tmp_path / 'r'}",
    ]
    runner = CliRunner()
    assert runner.invoke(rollout_app, ["start", *common, "--max-ticks", "1"]).exit_code == 0
    result = runner.invoke(rollout_app, ["abort", *common, "--reason", "pager went off"])
    assert result.exit_code == 0, result.output
    assert "rolled_back" in result.output and "pager went off" in result.output
    assert json.loads((tmp_path / "weights.json").read_text())["candidate"] == 0
    assert (tmp_path / "deploy.log").read_text() == "deploy candidate\nremove candidate\n"
    result = runner.invoke(rollout_app, ["promote", *common])
    assert result.exit_code != 0 and "cannot promote a rollout that is rolled_back" in str(result.exception)

    gateway.candidate_errors = 0.5
    other_state = tmp_path / "state2"
    result = runner.invoke(rollout_app, ["start", "--config", str(config), "--state-dir", str(other_state),
                                         "--registry", f"file://{tmp_path / 'r'}", "--poll-interval", "0.05"])  # fmt: skip
    assert result.exit_code == 1 and "rolled_back" in result.output and "error_rate" in result.output
