"""XIDs, NVSwitch SXids and Neuron hardware errors in this boot's kernel log, classified by the catalogue."""

from __future__ import annotations

from hpresilience.health.base import Check, CheckOptions, CheckResult, Status, register
from hpresilience.health.checks.common import (
    finding_dict,
    neuron_devices,
    nvidia_pci_devices,
    nvswitch_pci_devices,
    report,
    resolve_action,
)
from hpresilience.health.events import KernelLogUnavailable, read_kernel_log
from hpresilience.health.xid import KernelLogParser, load_catalog
from hpresilience.reasons import Action


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
            if ev.key in seen:
                continue
            c = catalog.classify(ev)
            label = {"nvidia": f"XID {ev.code}", "nvswitch": f"SXid {ev.code}"}.get(
                ev.vendor, f"NEURON_HW_ERR={ev.code}"
            )
            if ev.severity:
                label += f" {ev.severity}"
            where = f" on {ev.device}" if ev.device else ""
            if c.action in ("none", "warn"):
                seen[ev.key] = self.finding(
                    f"{label} ({c.entry.name}){where}",
                    Action.NONE,
                    ev.key,
                    False,
                    {"catalog_action": c.action},
                )
                continue
            action, boots = resolve_action(self.ctx, c.action, ev.key)
            seen[ev.key] = self.finding(
                f"{label} ({c.entry.name}){where}",
                action,
                ev.key,
                True,
                {"catalog_action": c.action, "boots_seen": boots},
            )
        evidence = {"source": source, "catalog_version": catalog.version, "lines": matched}
        actionable = [f for f in seen.values() if f.asks_action]
        warn_only = [f for f in seen.values() if f.evidence.get("catalog_action") == "warn"]
        findings = [finding_dict(f) for f in seen.values()]
        if actionable:
            return report(actionable, {**evidence, "findings": findings})
        if warn_only:
            return self.result(
                Status.WARN, warn_only[0].reason, key=warn_only[0].key, findings=findings, evidence=evidence
            )
        note = f"; {len(seen)} application-level XID(s) ignored" if seen else ""
        return self.ok(f"no hardware XIDs this boot{note}", findings=findings, evidence=evidence)
