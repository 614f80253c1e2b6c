"""The agent daemon's wing: registration, heartbeats, the idle policy, hardware, settings, the work stream and the
persistent workers' lives (workers.py), a trusted node's Ray. Light: no torch here; what runs job code is in
farm_agent.work."""
