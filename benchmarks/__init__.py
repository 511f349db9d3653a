"""Benchmarks and device checks: development tools beside the package, not installed with it."""
