"""The head's web dashboard, its JSON API, live updates and /metrics. Served in the head's process, composed at the
entry point (`farm head start`): the head never imports this package."""

from farm.dashboard.app import Dashboard, check_plain_http, reserve_port

__all__ = ["Dashboard", "check_plain_http", "reserve_port"]
