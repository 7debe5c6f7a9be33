"""Benchmarks and the data they run on (real checkpoint sequences: `python -m bench.checkpoints`)."""
