"""hpresilience: HyperPod-grade resilience for any Slurm cluster."""

__version__ = "0.1.0"
