"""Farm: idle Macs and NVIDIA boxes as one compute farm, scheduled by measured performance per watt."""

__version__ = "0.1.0"


SDK = ("Client", "Job", "JobInfo", "ShardInfo", "LogLine", "NodeInfo")


def __getattr__(name: str) -> object:
    """`farm.Client` and the SDK's records (farm.sdk), imported on first use: they bring in gRPC, which `import farm`
    alone does not need."""
    if name in SDK:
        from farm import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'farm' has no attribute {name!r}")
