"""tpuctl: a command-line control plane for Google Cloud TPU slices, with a built-in simulated TPU cloud."""

__version__ = "0.1.0"
