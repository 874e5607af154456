"""One vLLM engine measurement in its own process, so engines never overlap and each starts clean.

The engine module reads a spec JSON and writes a result JSON: ``python -m <module> spec.json result.json``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def run_engine_process(
    module: str,
    spec: dict[str, Any],
    label: str,
    env: dict[str, str],
    timeout_s: int,
    error: type[Exception],
) -> dict[str, Any]:
    """Run ``module`` on ``spec`` with ``env`` added; its result, or ``error`` naming ``label`` and stderr."""
    with tempfile.TemporaryDirectory(prefix="tandem-bench-engine-") as scratch:
        spec_path, result_path = Path(scratch) / "spec.json", Path(scratch) / "result.json"
        spec_path.write_text(json.dumps(spec))
        log.info("event=bench_engine module=%s label=%s", module, label)
        completed = subprocess.run(
            [sys.executable, "-m", module, str(spec_path), str(result_path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), **env},
        )
        if completed.returncode != 0 or not result_path.is_file():
            raise error(
                f"vLLM engine '{label}' failed (exit {completed.returncode}): {completed.stderr[-3000:]}"
            )
        return dict(json.loads(result_path.read_text()))
