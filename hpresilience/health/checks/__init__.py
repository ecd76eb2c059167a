"""Built-in checks, one module per family; importing this package registers them all."""

from hpresilience.health.checks import dcgm, efa, gpu, gpu_memory, infiniband, neuron, nvswitch, system, xid

__all__ = ["dcgm", "efa", "gpu", "gpu_memory", "infiniband", "neuron", "nvswitch", "system", "xid"]
