"""The Python API for a Farm head, used by the CLI and by programs: `farm.client.Client`."""

from farm.client.api import Client, HeadInfo, find_head

__all__ = ["Client", "HeadInfo", "find_head"]
