"""The worker: passes, one step's execution, the commit queue, leases, sleeping."""
