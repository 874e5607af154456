"""Benchmarks behind `tandem bench ...`: a package beside the libraries; results are data under bench/results/."""
