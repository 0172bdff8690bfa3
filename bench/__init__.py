"""Reproducible benchmarks: `make bench` (``python -m bench.run_all``). See bench/README.md."""
