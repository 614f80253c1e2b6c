"""What runs a job's shards on a node, one module per job kind, mirroring farm/head/kinds/: the head names them by
entry point (farm_agent.entry)."""
