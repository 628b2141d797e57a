"""The test harness: a real local stack (redis-server, Celery worker, web) as subprocesses, a
Sentinel set-up, and an HTTP client that follows SSE. The integration tests and the
whole-path benchmarks (bench.load, bench.scale, ...) both start the processes a user runs."""
