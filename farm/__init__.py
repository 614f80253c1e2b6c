"""Farm: idle Macs and NVIDIA boxes as one compute farm, scheduled by measured performance per watt."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`farm.Client`, imported on first use (it brings in gRPC, which `import farm` alone does not need)."""
    if name == "Client":
        from farm.client import Client

        return Client
    raise AttributeError(f"module 'farm' has no attribute {name!r}")
