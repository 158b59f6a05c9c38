"""Benchmarks: ``python -m grab_exp.bench <name>``."""
