"""Benchmarks and evaluations: ``python -m bench.NAME`` commands writing results/ CSV, JSON and PNG."""
