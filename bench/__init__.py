"""Benchmarks against baselines: `freshplan bench` runs them side by side in one run."""
