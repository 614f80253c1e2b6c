"""What runs inside a node's workers: the persistent worker's loop (host) and its frames, and the harness every shard
runs in (capture, environment, upload, prefetch, jobcode, memory); kinds/ holds one module per job kind. Never imports
the daemon's wing (farm_agent.daemon)."""
