"""duly's benchmark: throughput, latency, lateness, deliveries and fan-out on real PostgreSQL."""
