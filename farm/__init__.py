"""Farm: idle Macs and NVIDIA boxes as one compute farm, scheduled by measured performance per watt."""

__version__ = "0.1.0"
