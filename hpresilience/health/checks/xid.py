"""XIDs, NVSwitch SXids and Neuron hardware errors in this boot's kernel log, classified by the catalogue."""

from __future__ import annotations

from hpresilience.health.base import Check, CheckOptions, CheckResult, Status, register
from hpresilience.health.checks.common import (
    finding_dict,
    neuron_devices,
    nvidia_pci_devices,
    nvswitch_pci_devices,
    report,
)
from hpresilience.health.checks.rules import How, judge
from hpresilience.health.events import KernelLogUnavailable, read_kernel_log
from hpresilience.health.xid import Classified, FaultEvent, KernelLogParser, load_catalog


class XidOptions(CheckOptions):
    # How many matching lines to keep as evidence (a storm of XID 13 must not bloat the result).
    max_evidence_lines: int = 20


@register
class XidCheck(Check[XidOptions]):
    name = "xid"
    family = "xid"
    default_timeout_s = 10.0
    Options = XidOptions

    def _accelerators_present(self) -> bool:
        c = self.ctx
        return bool(
            c.kernel_log
            or c.nvml != "auto"
            or nvidia_pci_devices(c.paths)
            or nvswitch_pci_devices(c.paths)
            or neuron_devices(c.paths)
            or c.paths.proc("driver", "nvidia", "gpus").is_dir()
        )

    def run(self) -> CheckResult:
        if not self._accelerators_present():
            self.absent("no NVIDIA or Neuron devices whose kernel-log errors to watch")
        catalog = load_catalog(self.ctx.xid_overrides)
        path = self.ctx.kernel_log or str(self.ctx.paths.device("kmsg"))
        try:
            lines, source = read_kernel_log(path, self.ctx.command("dmesg"))
        except KernelLogUnavailable as err:
            return self.result(Status.UNKNOWN, f"kernel log unreadable: {err}")
        parser = KernelLogParser(catalog.aliases, source)
        seen: dict[str, CheckResult] = {}
        matched: list[str] = []
        for ev in (e for line in lines for e in parser.feed(line)):
            if len(matched) < self.options.max_evidence_lines:
                matched.append(ev.message[:300])
            if ev.key not in seen:  # one finding per fault key: the ladder counts a fault once per boot
                seen[ev.key] = self._finding(ev, catalog.classify(ev))
        return self._conclude(
            list(seen.values()), {"source": source, "catalog_version": catalog.version, "lines": matched}
        )

    def _finding(self, ev: FaultEvent, c: Classified) -> CheckResult:
        """The catalogue is this check's rule table: the event's code picks the entry, the entry the action."""
        label = {"nvidia": f"XID {ev.code}", "nvswitch": f"SXid {ev.code}"}.get(ev.vendor, f"NEURON_HW_ERR={ev.code}")
        label += f" {ev.severity}" if ev.severity else ""
        where = f" on {ev.device}" if ev.device else ""
        how = How.of(c.action)
        action, boots = judge(self.ctx, how, ev.key)
        detail: dict[str, object] = {"catalog_action": c.action}
        if how is not How.WARN:
            detail["boots_seen"] = boots or 0
        return self.finding(f"{label} ({c.entry.name}){where}", action, ev.key, how is not How.WARN, detail)

    def _conclude(self, seen: list[CheckResult], evidence: dict[str, object]) -> CheckResult:
        """The worst fault that asks for an action; else the first the catalogue says to warn of; else ok."""
        findings = [finding_dict(f) for f in seen]
        actionable = [f for f in seen if f.asks_action]
        warn_only = [f for f in seen if f.evidence.get("catalog_action") == "warn"]
        if actionable:
            return report(actionable, {**evidence, "findings": findings})
        if warn_only:
            return self.result(
                Status.WARN, warn_only[0].reason, key=warn_only[0].key, findings=findings, evidence=evidence
            )
        note = f"; {len(seen)} application-level XID(s) ignored" if seen else ""
        return self.ok(f"no hardware XIDs this boot{note}", findings=findings, evidence=evidence)
