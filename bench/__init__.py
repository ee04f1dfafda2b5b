"""duly's benchmark: throughput, start-to-run latency and timer lateness on a real PostgreSQL."""
