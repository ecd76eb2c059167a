"""Reading NVIDIA GPU state: NVML through pynvml, `nvidia-smi -q -x` when NVML cannot load, or a recording.

All three produce the same GpuSnapshot, so the GPU checks never know which one answered. A recorded
snapshot is JSON with the fields of GpuInfo (what `hpresilience.testing.fakenode` writes and flips).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from hpresilience import proc
from hpresilience.proc import resolve


class NvmlUnavailable(Exception):
    """No NVML source could be opened (no driver, no library, no nvidia-smi)."""


@dataclass
class GpuInfo:
    index: int
    pci_bus_id: str = ""
    uuid: str = ""
    name: str = ""
    # The handle answers GPU_IS_LOST / UNKNOWN: the GPU fell off the bus or the driver lost it.
    lost: bool = False
    error: str = ""
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    sram_threshold_exceeded: bool | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    clock_event_reasons: int | None = None
    # NVML field 230; RECOVERY_UNRECOGNISED when the source printed a value this reader does not know.
    recovery_action: int | None = None
    recovery_action_text: str = ""
    # Blackwell-era memory repair flags (nvidia-smi XML schema v13, NVML repair status).
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class GpuSnapshot:
    source: str  # "nvml", "nvidia-smi", "recorded:<path>"
    driver_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "driver_version": self.driver_version,
            "gpus": [asdict(g) for g in self.gpus],
        }


class GpuReader(Protocol):
    def snapshot(self) -> GpuSnapshot: ...


# -- recorded -------------------------------------------------------------------------------------------
class RecordedReader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def snapshot(self) -> GpuSnapshot:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise NvmlUnavailable(f"no recorded NVML snapshot at {self.path}") from None
        if data.get("unavailable"):
            raise NvmlUnavailable(str(data.get("unavailable")))
        return GpuSnapshot(
            f"recorded:{self.path}",
            str(data.get("driver_version", "")),
            [GpuInfo.from_dict(g) for g in data.get("gpus", [])],
        )


# -- nvidia-smi -q -x -----------------------------------------------------------------------------------
def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    el = node.find(path)
    if el is None or el.text is None:
        return None
    t = el.text.strip()
    return None if t in ("", "N/A", "[N/A]", "Unknown Error", "[Unknown Error]") else t


def _int(node: ET.Element | None, path: str) -> int | None:
    t = _text(node, path)
    if t is None:
        return None
    try:
        return int(t.split()[0].rstrip("x"), 0)
    except ValueError:
        return None


def _yes(node: ET.Element | None, path: str) -> bool | None:
    t = _text(node, path)
    return None if t is None else t.lower() in ("yes", "active", "true")


# NVML clocks-event (throttle) reason bits, shared by the reader and the gpu.clocks check.
CLOCK_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
RECOVERY_UNRECOGNISED = -1
# nvidia-smi prints the short words (`Reset`, `Reboot`, seen on real machines); NVML's names are the long ones.
_RECOVERY = {
    "none": 0,
    "reset": 1,
    "reboot": 2,
    "gpu reset": 1,
    "gpu_reset": 1,
    "node reboot": 2,
    "node_reboot": 2,
    "drain p2p": 3,
    "drain_p2p": 3,
    "drain and reset": 4,
    "drain_and_reset": 4,
}


def _ecc_sum(gpu: ET.Element, scope: str, uncorrectable: bool) -> int | None:
    """Sum the SRAM/DRAM (DTD v12) or single/double-bit (older DTDs) counters of one scope."""
    node = gpu.find(f"ecc_errors/{scope}")
    if node is None:
        return None
    total, seen = 0, False
    for child in node:
        tag = child.tag
        if tag in ("single_bit", "double_bit"):
            if (tag == "double_bit") != uncorrectable:
                continue
            v = _int(child, "total")
        elif ("uncorrectable" in tag) == uncorrectable and "correctable" in tag:
            v = _int(node, tag)
        else:
            continue
        if v is not None:
            total, seen = total + v, True
    return total if seen else None


def parse_nvidia_smi_xml(text: str) -> GpuSnapshot:
    """GpuSnapshot from `nvidia-smi -q -x` (DTD v11/v12: clocks_event_reasons or clocks_throttle_reasons)."""
    root = ET.fromstring(text)
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        reasons = g.find("clocks_event_reasons")
        prefix = "clocks_event_reason_"
        if reasons is None:
            reasons, prefix = g.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
        mask: int | None = None
        if reasons is not None:
            mask = 0
            for name, bit in CLOCK_REASONS.items():
                if _yes(reasons, prefix + name):
                    mask |= bit
        rec = _text(g, "gpu_recovery_action")
        link = g.find("pci/pci_gpu_link_info")
        info = GpuInfo(
            index=i,
            pci_bus_id=g.get("id", "") or (_text(g, "pci/pci_bus_id") or ""),
            uuid=_text(g, "uuid") or "",
            name=_text(g, "product_name") or "",
            ecc_volatile_uncorrected=_ecc_sum(g, "volatile", True),
            ecc_aggregate_uncorrected=_ecc_sum(g, "aggregate", True),
            ecc_volatile_corrected=_ecc_sum(g, "volatile", False),
            sram_threshold_exceeded=_yes(g, "ecc_errors/aggregate/sram_threshold_exceeded"),
            remapped_rows_corrected=_int(g, "remapped_rows/remapped_row_corr"),
            remapped_rows_uncorrected=_int(g, "remapped_rows/remapped_row_unc"),
            remap_pending=_yes(g, "remapped_rows/remapped_row_pending"),
            remap_failure=_yes(g, "remapped_rows/remapped_row_failure"),
            retired_pages_sbe=_int(g, "retired_pages/multiple_single_bit_retirement/retired_count"),
            retired_pages_dbe=_int(g, "retired_pages/double_bit_retirement/retired_count"),
            retired_pages_pending=_yes(g, "retired_pages/pending_retirement"),
            pcie_gen_current=_int(link, "pcie_gen/current_link_gen"),
            pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
            pcie_width_current=_int(link, "link_widths/current_link_width"),
            pcie_width_max=_int(link, "link_widths/max_link_width"),
            clock_event_reasons=mask,
            recovery_action=None if rec is None else _RECOVERY.get(rec.lower(), RECOVERY_UNRECOGNISED),
            recovery_action_text=rec or "",
            channel_repair_pending=_yes(g, "ecc_errors/channel_repair_pending"),
            tpc_repair_pending=_yes(g, "ecc_errors/tpc_repair_pending"),
            unrepairable_memory=_yes(g, "ecc_errors/unrepairable_memory"),
        )
        gpus.append(info)
    return GpuSnapshot("nvidia-smi", _text(root, "driver_version") or "", gpus)


class NvidiaSmiReader:
    def __init__(self, tool: str, timeout: float = 20.0) -> None:
        self.tool = tool
        self.timeout = timeout

    def snapshot(self) -> GpuSnapshot:
        exe = resolve(self.tool)
        if exe is None:
            raise NvmlUnavailable(f"{self.tool} not found")
        res = proc.run([exe, "-q", "-x"], self.timeout)
        if not res.ok:
            raise NvmlUnavailable(res.describe())
        try:
            return parse_nvidia_smi_xml(res.stdout)
        except ET.ParseError as err:
            raise NvmlUnavailable(f"{self.tool} -q -x printed XML that does not parse: {err}") from None


# -- pynvml -----------------------------------------------------------------------------------------------
class PynvmlReader:
    """The real NVML. Each query is guarded: an unsupported call leaves the field None."""

    def snapshot(self) -> GpuSnapshot:
        try:
            import pynvml
        except ImportError as err:
            raise NvmlUnavailable(f"pynvml not importable: {err}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML init failed: {err}") from None
        try:
            try:
                driver = _call(pynvml.nvmlSystemGetDriverVersion) or ""
            except GpuLostError:
                driver = ""
            count = pynvml.nvmlDeviceGetCount()
            return GpuSnapshot("nvml", str(driver), [self._gpu(pynvml, i) for i in range(count)])
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def _gpu(self, nv: Any, i: int) -> GpuInfo:
        info = GpuInfo(index=i)
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as err:
            info.lost, info.error = _is_lost(nv, err), str(err)
            return info
        try:
            info.pci_bus_id = str(nv.nvmlDeviceGetPciInfo(h).busId)
            info.uuid = str(nv.nvmlDeviceGetUUID(h))
        except nv.NVMLError as err:
            if _is_lost(nv, err):
                info.lost, info.error = True, str(err)
                return info
        try:
            self._fields(nv, h, info)
        except GpuLostError as err:
            # Lost in the middle of the query: every field read so far is suspect, the GPU is gone.
            info.lost, info.error = True, str(err)
        return info

    def _fields(self, nv: Any, h: Any, info: GpuInfo) -> None:
        info.name = str(_call(nv.nvmlDeviceGetName, h) or "")
        unc, vol, agg = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        info.ecc_volatile_uncorrected = _call(nv.nvmlDeviceGetTotalEccErrors, h, unc, vol)
        info.ecc_aggregate_uncorrected = _call(nv.nvmlDeviceGetTotalEccErrors, h, unc, agg)
        info.ecc_volatile_corrected = _call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, vol)
        rows = _call(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            info.remapped_rows_corrected, info.remapped_rows_uncorrected = int(rows[0]), int(rows[1])
            info.remap_pending, info.remap_failure = bool(rows[2]), bool(rows[3])
        sbe = _call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = _call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        info.retired_pages_sbe = None if sbe is None else len(sbe)
        info.retired_pages_dbe = None if dbe is None else len(dbe)
        pending = _call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        info.retired_pages_pending = None if pending is None else bool(pending)
        info.pcie_gen_current = _call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
        info.pcie_gen_max = _call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        info.pcie_width_current = _call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        info.pcie_width_max = _call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        info.clock_event_reasons = _call(reasons, h)
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
        values = _call(nv.nvmlDeviceGetFieldValues, h, [field_id])
        if values is not None and len(values) and int(values[0].nvmlReturn) == 0:
            info.recovery_action = int(values[0].value.uiVal)
        repair = _call(getattr(nv, "nvmlDeviceGetRepairStatus", None), h)
        if repair is not None:
            info.channel_repair_pending = bool(getattr(repair, "bChannelRepairPending", False))
            info.tpc_repair_pending = bool(getattr(repair, "bTpcRepairPending", False))
        flag = _call(getattr(nv, "nvmlDeviceGetUnrepairableMemoryFlag_v1", None), h)
        if flag is not None:
            info.unrepairable_memory = bool(getattr(flag, "bUnrepairableMemory", flag))


def _is_lost(nv: Any, err: Exception) -> bool:
    code = getattr(err, "value", None)
    return code in (getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15), getattr(nv, "NVML_ERROR_UNKNOWN", 999))


class GpuLostError(Exception):
    """NVML answered GPU_IS_LOST in the middle of reading a GPU."""


# NVML_ERROR_GPU_IS_LOST: never a "field not supported", always the GPU itself.
_GPU_IS_LOST = 15


def _call(fn: Any, *args: Any) -> Any:
    """One NVML query; None where it is not supported (or absent), GpuLostError when the GPU is lost."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - NOT_SUPPORTED and friends: the field stays unknown
        if getattr(err, "value", None) == _GPU_IS_LOST:
            raise GpuLostError(str(err)) from None
        return None


NVML_SOURCES = ("auto", "pynvml", "nvidia-smi")


def nvml_source_error(source: str) -> str | None:
    """Why `health.nvml` is not a valid source, or None: a keyword, or a path to a recorded JSON snapshot."""
    if source in NVML_SOURCES:
        return None
    if "/" in source and source.endswith(".json"):
        return None
    return (
        f"{source!r} is neither one of {', '.join(NVML_SOURCES)} nor a path to a recorded snapshot "
        "(a path with a '/' ending in .json)"
    )


def open_reader(source: str, nvidia_smi: str) -> GpuReader:
    """The reader for config `health.nvml`; "auto" tries pynvml and falls back to nvidia-smi."""
    if source == "pynvml":
        return PynvmlReader()
    if source == "nvidia-smi":
        return NvidiaSmiReader(nvidia_smi)
    if source == "auto":
        return _AutoReader(nvidia_smi)
    problem = nvml_source_error(source)
    if problem is not None:
        # Settings validation refuses this first; a context built by hand must not read it as a path.
        raise NvmlUnavailable(f"health.nvml: {problem}")
    return RecordedReader(Path(source))


class _AutoReader:
    def __init__(self, nvidia_smi: str) -> None:
        self.nvidia_smi = nvidia_smi

    def snapshot(self) -> GpuSnapshot:
        try:
            return PynvmlReader().snapshot()
        except NvmlUnavailable as first:
            try:
                return NvidiaSmiReader(self.nvidia_smi).snapshot()
            except NvmlUnavailable as second:
                raise NvmlUnavailable(f"{first}; fallback: {second}") from None
