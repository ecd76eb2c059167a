"""Built-in checks, one module per family; importing this package registers them all in CHECKS."""

from hpresilience.health.base import CHECKS
from hpresilience.health.checks import dcgm, efa, gpu, gpu_memory, infiniband, neuron, nvswitch, system, xid

__all__ = ["CHECKS", "dcgm", "efa", "gpu", "gpu_memory", "infiniband", "neuron", "nvswitch", "system", "xid"]
