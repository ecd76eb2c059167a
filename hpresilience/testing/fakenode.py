"""Fault injection: a fake node's hardware under one directory, and ways to flip it into a faulty state.

Every devcluster "node" is the same machine, so each agent gets its own root, laid out exactly like
the real one: `sys/` (sysfs: PCI, DMI, CPUs, Neuron, EFA), `proc/` (meminfo, mounts, boot_id),
`dev/` (kmsg as a plain file the injector appends to, infiniband/uverbs*), `nvml.json` (a recorded
NVML snapshot) and `state/`. `config.yaml` holds the `health:` section pointing at all of it. What each
instance kind has (GPUs, Neuron devices, EFA counters) is in fakehw.py.

    python -m hpresilience.testing.fakenode make ROOT --kind p5.48xlarge
    python -m hpresilience.testing.fakenode inject ROOT xid:79:0      # XID 79 on GPU 0, in the kernel log
    python -m hpresilience.testing.fakenode inject ROOT remap_failure:3
    python -m hpresilience.testing.fakenode reboot ROOT                # new boot id, fresh kernel log
    python -m hpresilience.testing.fakenode heal ROOT
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from hpresilience.fileio import atomic_write_text
from hpresilience.testing.fakehw import (
    EFA_DEV_COUNTERS,
    EFA_PORT_COUNTERS,
    KINDS,
    NEURON_LAYOUTS,
    healthy_gpu,
    neuron_counter_paths,
)


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class FakeNode:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        meta = json.loads((self.root / "node.json").read_text()) if (self.root / "node.json").exists() else {}
        self.kind: str = meta.get("kind", "generic")
        self.neuron_layout: str = meta.get("neuron_layout", "pre-2.31")
        self.efa: int | None = meta.get("efa")

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def nvml_path(self) -> Path:
        return self.root / "nvml.json"

    @property
    def kmsg(self) -> Path:
        return self.root / "dev" / "kmsg"

    # -- building ---------------------------------------------------------------------------------------
    @classmethod
    def make(
        cls, root: Path, kind: str = "generic", neuron_layout: str = "pre-2.31", efa: int | None = None
    ) -> FakeNode:
        """A healthy node of `kind`; `efa` overrides the EFA device count (fewer files for tests)."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        if neuron_layout not in NEURON_LAYOUTS:
            raise ValueError(f"unknown Neuron layout {neuron_layout!r}; known: {', '.join(NEURON_LAYOUTS)}")
        root = Path(root)
        if root.exists():
            shutil.rmtree(root)
        _w(root / "node.json", json.dumps({"kind": kind, "neuron_layout": neuron_layout, "efa": efa}))
        node = cls(root)
        node._build()
        return node

    def _build(self) -> None:
        spec = KINDS[self.kind]
        s, p = self.sys, self.proc
        _w(
            s / "devices/virtual/dmi/id/product_name",
            f"{self.kind}\n" if self.kind != "generic" else "Standard PC\n",
        )
        _w(s / "devices/system/cpu/online", f"0-{spec['cpus'] - 1}\n")
        kb = spec["mem_gib"] * 1024 * 1024
        _w(
            p / "meminfo",
            f"MemTotal:       {kb - 2_000_000} kB\nMemFree:        {kb // 2} kB\nMemAvailable:   {kb - 8_000_000} kB\n",
        )
        _w(
            p / "mounts",
            "/dev/root / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"
            "fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcd /fsx lustre rw 0 0\n",
        )
        _w(p / "stat", "cpu  1 2 3 4\nbtime 1763860000\n")
        _w(p / "sys/kernel/random/boot_id", f"{uuid.uuid4()}\n")
        _w(self.kmsg, "")
        gpus = [healthy_gpu(i, b, spec["gpu_name"], spec.get("pcie_gen", 4)) for i, b in enumerate(spec["gpus"])]
        for g in gpus:
            pci = s / "bus/pci/devices" / g["pci_bus_id"][4:].lower()
            _w(pci / "vendor", "0x10de\n")
            _w(pci / "class", "0x030200\n")
        if gpus:
            self.write_nvml({"driver_version": "550.127.05", "gpus": gpus})
        for n in range(spec["neuron"]):
            d = s / f"devices/virtual/neuron_device/neuron{n}"
            _w(d / "core_count", "2\n")
            _w(d / "info/architecture/instance_type", f"{self.kind}\n")
            for rel in neuron_counter_paths(self.neuron_layout).values():
                _w(d / rel, "0\n")
                if rel.endswith("/total"):
                    _w(d / rel.replace("/total", "/present"), "0\n")
        for e in range(spec["efa"] if self.efa is None else self.efa):
            d = s / f"class/infiniband/rdmap{e}s0"
            _w(d / "device/vendor", "0x1d0f\n")
            _w(d / "ports/1/state", "4: ACTIVE\n")
            _w(d / "ports/1/phys_state", "5: LinkUp\n")
            for c in EFA_PORT_COUNTERS:
                _w(d / "ports/1/hw_counters" / c, "0\n")
            for c in EFA_DEV_COUNTERS:
                _w(d / "hw_counters" / c, "0\n")
            _w(self.dev / f"infiniband/uverbs{e}", "")
        health: dict[str, Any] = {
            "profile": self.kind,
            "path": {"sysfs": str(s), "procfs": str(p), "dev": str(self.dev)},
            "kernel_log": str(self.kmsg),
            "state_dir": str(self.root / "state"),
            "nvml": str(self.nvml_path),
            "checks": {"system.disk": {"paths": ["/"]}},
        }
        _w(self.root / "config.yaml", yaml.safe_dump({"health": health}, sort_keys=False))

    # -- NVML snapshot ----------------------------------------------------------------------------------
    def read_nvml(self) -> dict[str, Any]:
        return dict(json.loads(self.nvml_path.read_text())) if self.nvml_path.exists() else {"gpus": []}

    def write_nvml(self, data: dict[str, Any]) -> None:
        atomic_write_text(self.nvml_path, json.dumps(data, indent=1), mode=0o644)

    def set_gpu(self, index: int, **values: Any) -> None:
        data = self.read_nvml()
        data["gpus"][index].update(values)
        self.write_nvml(data)

    # -- faults -----------------------------------------------------------------------------------------
    def log(self, line: str, seq: int | None = None) -> None:
        """Append one /dev/kmsg-style record."""
        text = self.kmsg.read_text() if self.kmsg.exists() else ""
        n = seq if seq is not None else text.count("\n") + 1
        with open(self.kmsg, "a") as f:
            f.write(f"3,{n},{n * 1_000_000 + 123},-;{line}\n")

    def gpu_bus(self, index: int) -> str:
        bus = str(self.read_nvml()["gpus"][index]["pci_bus_id"])
        return bus[4:].lower().rsplit(".", 1)[0]

    def inject(self, fault: str) -> None:
        name, _, arg = fault.partition(":")
        args = arg.split(":") if arg else []
        if name == "xid":
            code, gpu = int(args[0]), int(args[1]) if len(args) > 1 else 0
            bus = self.gpu_bus(gpu) if self.read_nvml()["gpus"] else "0000:53:00"
            self.log(f"NVRM: Xid (PCI:{bus}): {code}, pid='<unknown>', name=<unknown>, injected by hpresilience")
        elif name == "neuron_hw_err":
            dev = args[1] if len(args) > 1 else "0"
            self.log(
                f"NEURON_HW_ERR={args[0]} instance-id=i-0123456789abcdef0 hostname=fake nd-id={dev} nc-id=0 "
                "serial-num=19fcda00f5ff6eb9 action=TERMINATE_INSTANCE"
            )
        elif name == "gpu_lost":
            self.set_gpu(int(args[0]), lost=True, error="GPU is lost")
        elif name == "remap_pending":
            self.set_gpu(int(args[0]), remap_pending=True)
        elif name == "remap_failure":
            self.set_gpu(int(args[0]), remap_failure=True)
        elif name == "ecc":
            self.set_gpu(int(args[0]), ecc_volatile_uncorrected=int(args[1]) if len(args) > 1 else 1)
        elif name == "gpu_missing":
            data = self.read_nvml()
            data["gpus"] = data["gpus"][:-1]
            self.write_nvml(data)
        elif name in ("neuron_ecc", "neuron_hw_error"):
            counter = "mem_ecc_uncorrected" if name == "neuron_ecc" else "hw_error@0"
            rel = neuron_counter_paths(self.neuron_layout)[counter]
            path = self.sys / f"devices/virtual/neuron_device/neuron{args[0] if args else 0}" / rel
            path.write_text(f"{int(path.read_text()) + 1}\n")
        elif name == "neuron_core_error":
            # neuron_core_error:COUNTER[:dev[:core]], e.g. neuron_core_error:hw_nc_ue_error:3:1
            counter, dev = args[0], args[1] if len(args) > 1 else "0"
            core = args[2] if len(args) > 2 else "0"
            rel = neuron_counter_paths(self.neuron_layout, int(core) + 1)[f"{counter}@{core}"]
            path = self.sys / f"devices/virtual/neuron_device/neuron{dev}" / rel
            path.write_text(f"{int(path.read_text()) + 1}\n")
        elif name == "efa_down":
            (self.sys / f"class/infiniband/rdmap{args[0] if args else 0}s0/ports/1/state").write_text("1: DOWN\n")
        elif name == "efa_counter":
            dev, counter, n = args[0], args[1], int(args[2])
            path = self.sys / f"class/infiniband/rdmap{dev}s0/ports/1/hw_counters/{counter}"
            path.write_text(f"{int(path.read_text()) + n}\n")
        else:
            raise ValueError(
                f"unknown fault {fault!r}; known: xid:N[:gpu], neuron_hw_err:CODE[:dev], gpu_lost:i, "
                "remap_pending:i, remap_failure:i, ecc:i[:n], gpu_missing, neuron_ecc[:dev], "
                "neuron_hw_error[:dev], neuron_core_error:counter[:dev[:core]], efa_down[:dev], "
                "efa_counter:dev:name:n"
            )

    def reboot(self) -> None:
        """What a reboot clears: the kernel log, volatile ECC, pending remaps (applied), Neuron counters."""
        _w(self.proc / "sys/kernel/random/boot_id", f"{uuid.uuid4()}\n")
        _w(self.kmsg, "")
        data = self.read_nvml()
        for g in data.get("gpus", []):
            g.update(ecc_volatile_uncorrected=0, remap_pending=False, lost=False, error="")
        if data.get("gpus"):
            self.write_nvml(data)
        for rel in neuron_counter_paths(self.neuron_layout).values():
            for dev in (self.sys / "devices/virtual/neuron_device").glob("neuron*"):
                if (dev / rel).exists():
                    (dev / rel).write_text("0\n")

    def heal(self) -> None:
        """Back to the healthy recording, keeping the boot id and escalation history."""
        boot = (self.proc / "sys/kernel/random/boot_id").read_text()
        state = self.root / "state"
        keep = self.root.parent / f".{self.root.name}.state"
        if state.exists():
            shutil.move(str(state), keep)
        FakeNode.make(self.root, self.kind, self.neuron_layout, self.efa)
        _w(self.proc / "sys/kernel/random/boot_id", boot)
        if keep.exists():
            shutil.move(str(keep), state)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpresilience.testing.fakenode", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="build a healthy fake node root")
    mk.add_argument("root")
    mk.add_argument("--kind", default="generic", choices=sorted(KINDS))
    mk.add_argument("--neuron-layout", default="pre-2.31", choices=NEURON_LAYOUTS)
    inj = sub.add_parser("inject", help="flip the node into a faulty state")
    inj.add_argument("root")
    inj.add_argument("faults", nargs="+")
    for name in ("reboot", "heal"):
        sub.add_parser(name).add_argument("root")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "make":
            node = FakeNode.make(Path(a.root), a.kind, a.neuron_layout)
            print(node.root / "config.yaml")
        elif a.cmd == "inject":
            node = FakeNode(Path(a.root))
            for f in a.faults:
                node.inject(f)
        elif a.cmd == "reboot":
            FakeNode(Path(a.root)).reboot()
        else:
            FakeNode(Path(a.root)).heal()
    except (ValueError, IndexError, OSError) as err:
        print(f"fault: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
