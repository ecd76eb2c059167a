"""The hardware a fake node can be (fakenode.py builds it): instance kinds with their GPUs, CPUs and memory, the
EFA counters, and where the Neuron driver keeps its error counters in each of its sysfs layouts.

The names and layouts are the real ones (NVML's bus ids, the EFA driver's counter files, the Neuron driver's status
table), so the health checks read a fake node exactly as they read a real one.
"""

from __future__ import annotations

import uuid
from typing import Any

# Bus ids of the 8 H100s of a p5.48xlarge and the 8 A100s of a p4d.24xlarge, as NVML prints them.
P5_GPUS = [
    "00000000:53:00.0",
    "00000000:64:00.0",
    "00000000:75:00.0",
    "00000000:86:00.0",
    "00000000:97:00.0",
    "00000000:A8:00.0",
    "00000000:B9:00.0",
    "00000000:CA:00.0",
]
P4D_GPUS = [
    "00000000:10:1C.0",
    "00000000:10:1D.0",
    "00000000:20:1C.0",
    "00000000:20:1D.0",
    "00000000:90:1C.0",
    "00000000:90:1D.0",
    "00000000:A0:1C.0",
    "00000000:A0:1D.0",
]
KINDS: dict[str, dict[str, Any]] = {
    "generic": {"gpus": [], "gpu_name": "", "neuron": 0, "efa": 0, "cpus": 8, "mem_gib": 32},
    "p4d.24xlarge": {
        "gpus": P4D_GPUS,
        "gpu_name": "NVIDIA A100-SXM4-40GB",
        "pcie_gen": 4,
        "neuron": 0,
        "efa": 4,
        "cpus": 96,
        "mem_gib": 1152,
    },
    "p5.48xlarge": {
        "gpus": P5_GPUS,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "pcie_gen": 5,
        "neuron": 0,
        "efa": 32,
        "cpus": 192,
        "mem_gib": 2048,
    },
    "trn1.32xlarge": {"gpus": [], "gpu_name": "", "neuron": 16, "efa": 8, "cpus": 128, "mem_gib": 512},
    "trn2.48xlarge": {"gpus": [], "gpu_name": "", "neuron": 16, "efa": 16, "cpus": 192, "mem_gib": 2048},
}
NEURON_LAYOUTS = ("pre-2.31", "relocated")
EFA_PORT_COUNTERS = [
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
]
EFA_DEV_COUNTERS = [
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
]


def healthy_gpu(i: int, bus: str, name: str, gen: int) -> dict[str, Any]:
    return {
        "index": i,
        "pci_bus_id": bus,
        "uuid": f"GPU-{uuid.UUID(int=0x5EED0000 + i)}",
        "name": name,
        "lost": False,
        "error": "",
        "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_uncorrected": 0,
        "ecc_volatile_corrected": 0,
        "sram_threshold_exceeded": False,
        "remapped_rows_corrected": 0,
        "remapped_rows_uncorrected": 0,
        "remap_pending": False,
        "remap_failure": False,
        "retired_pages_sbe": None,
        "retired_pages_dbe": None,
        "retired_pages_pending": None,
        "pcie_gen_current": gen,
        "pcie_gen_max": gen,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
        "clock_event_reasons": 0x1,
        "recovery_action": 0,
    }


# Per-NeuronCore hardware error counters of the driver's status table (driver 2.x sysfs metrics).
NEURON_CORE_HW_COUNTERS = (
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "hw_collectives_error",
    "hw_repairable_hbm_ue_error",
)


def neuron_counter_paths(layout: str, cores: int = 2) -> dict[str, str]:
    """Counter name -> path under neuron<N>/ for one layout (dirs with `total` for status counters)."""
    if layout == "pre-2.31":
        paths = {
            "mem_ecc_uncorrected": "stats/hardware/mem_ecc_uncorrected",
            "mem_ecc_repairable_uncorrected": "stats/hardware/mem_ecc_repairable_uncorrected",
            "sram_ecc_uncorrected": "stats/hardware/sram_ecc_uncorrected",
        }
        for c in range(cores):
            paths[f"hw_error@{c}"] = f"neuron_core{c}/stats/status/hw_error/total"
            paths[f"reset_fail_count@{c}"] = f"neuron_core{c}/stats/other_info/reset_fail_count/total"
            for name in NEURON_CORE_HW_COUNTERS:
                paths[f"{name}@{c}"] = f"neuron_core{c}/stats/status/{name}/total"
        return paths
    # Driver 2.31 moved nodes; this layout stands for "the same counter names under other directories".
    paths = {
        "mem_ecc_uncorrected": "hardware/ecc/mem_ecc_uncorrected",
        "mem_ecc_repairable_uncorrected": "hardware/ecc/mem_ecc_repairable_uncorrected",
        "sram_ecc_uncorrected": "hardware/ecc/sram_ecc_uncorrected",
    }
    for c in range(cores):
        paths[f"hw_error@{c}"] = f"cores/neuron_core{c}/status/hw_error/total"
        paths[f"reset_fail_count@{c}"] = f"cores/neuron_core{c}/reset/reset_fail_count"
        for name in NEURON_CORE_HW_COUNTERS:
            paths[f"{name}@{c}"] = f"cores/neuron_core{c}/status/{name}/total"
    return paths
