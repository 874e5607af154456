"""Benchmarks behind ``tandem bench ...``: a package beside the libraries; results are data under
``bench/results/`` (:data:`RESULTS_DIR`, absolute, so a run from any directory writes to the same place)."""

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
