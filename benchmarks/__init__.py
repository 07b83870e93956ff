"""Benchmarks run by ``make bench`` (``python -m benchmarks``); each compares against its baseline
in the same run and writes its figures to ``bench-results/``."""
