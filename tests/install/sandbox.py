"""Run a unit's ExecStart inside its file-system sandbox, emulated with a mount namespace.

systemd is not PID 1 on these machines, so `systemctl start` cannot show what the unit's hardening does to the
daemon. This applies the settings that decide what a daemon can read and write, the way systemd does, in a
private mount namespace (`unshare --mount`, root only):

- ProtectSystem=strict: every mount read-only except the API file systems (/dev, /proc, /sys) and the paths
  below; ProtectSystem=full/yes: /usr, /boot, /efi (and /etc for full) read-only.
- StateDirectory=A B: /var/lib/A, /var/lib/B writable (under the install root when the unit was installed with
  --root: its paths are the root's); ReadWritePaths=: those paths writable.
- ProtectHome=yes|tmpfs: /home, /root, /run/user hidden (an empty read-only tmpfs); read-only: visible, read-only.
- PrivateTmp=yes: a fresh, empty, writable /tmp and /var/tmp. The test's own tree lives in /tmp (a production
  install lives in /opt, /etc and /var): `keep` names the paths bound back in, read-only unless listed as writable.

Used as `python3 sandbox.py SPEC_JSON -- ARGV...` under `unshare --mount --propagation private`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

API_FS = ("/proc", "/sys", "/dev")
HOME_DIRS = ("/home", "/root", "/run/user")


def directives(unit_text: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit, each key's values in order (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in unit_text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
        if m:
            out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


def last(d: dict[str, list[str]], key: str, default: str = "") -> str:
    return d.get(key, [default])[-1]


def writable_paths(unit_text: str, root: Path) -> list[Path]:
    """What the unit leaves writable: its StateDirectory= entries under /var/lib and its ReadWritePaths=,
    both taken under the install `root`."""
    d = directives(unit_text)
    out = [root / "var/lib" / name for v in d.get("StateDirectory", []) for name in v.split()]
    out += [root / p.lstrip("-/") for v in d.get("ReadWritePaths", []) for p in v.split()]
    return out


def exec_start(unit_text: str) -> list[str]:
    return shlex.split(last(directives(unit_text), "ExecStart"))


def spec_for(unit_text: str, root: Path, keep: list[Path]) -> dict[str, object]:
    d = directives(unit_text)
    return {
        "protect_system": last(d, "ProtectSystem", "no"),
        "protect_home": last(d, "ProtectHome", "no"),
        "private_tmp": last(d, "PrivateTmp", "no") in ("yes", "true", "1"),
        "writable": [str(p) for p in writable_paths(unit_text, root)],
        "keep": [str(p) for p in keep],
    }


def command(unit_text: str, root: Path, keep: list[Path], argv: list[str]) -> list[str]:
    """The argv that runs `argv` inside the unit's sandbox."""
    spec = json.dumps(spec_for(unit_text, root, keep))
    return ["unshare", "--mount", "--propagation", "private", sys.executable, __file__, spec, "--", *argv]


# -- inside the namespace -------------------------------------------------------------------------------
def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _under(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mount_points() -> list[str]:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return [
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]


def _hide(directory: str, held: dict[str, int], mode: str) -> None:
    """An empty tmpfs over `directory`, with the held paths below it bound back in; then `mode` (ro/rw)."""
    _mount("-t", "tmpfs", "-o", "mode=1777" if mode == "rw" else "mode=755", "tmpfs", directory)
    for p, fd in held.items():
        if _under(p, (directory,)):
            os.makedirs(p, exist_ok=True)
            # -c: mount(8) would resolve the fd link to its path name, which now names the empty dir.
            subprocess.run(["mount", "-c", "--bind", f"/proc/self/fd/{fd}", p], check=True, pass_fds=(fd,))
    if mode == "ro":
        _mount("-o", "remount,ro", directory)


def apply(spec: dict[str, object]) -> None:
    writable = [str(p) for p in spec["writable"]]  # type: ignore[attr-defined]
    keep = [str(p) for p in spec["keep"]]  # type: ignore[attr-defined]
    home = str(spec["protect_home"])
    hidden_home = home in ("yes", "true", "tmpfs")
    # Opened before anything is hidden: bound back in from these descriptors afterwards.
    held = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in keep if os.path.isdir(p)}
    tmp_dirs: list[str] = []
    if spec["private_tmp"]:
        for t in ("/tmp", "/var/tmp"):
            _hide(t, held, "rw")
            tmp_dirs.append(t)
    for h in HOME_DIRS:
        if not os.path.isdir(h):
            continue
        if hidden_home:
            _hide(h, held, "ro")
        elif home == "read-only":
            _mount("--bind", h, h)
            _mount("-o", "remount,bind,ro", h)
    for fd in held.values():
        os.close(fd)
    for w in writable:
        os.makedirs(w, exist_ok=True)
        _mount("--bind", w, w)
    system = str(spec["protect_system"])
    if system == "strict":
        for point in _mount_points():
            if _under(point, API_FS) or point in writable or point in tmp_dirs:
                continue
            _mount("-o", "remount,bind,ro", point)
    elif system in ("yes", "true", "full"):
        for p in ("/usr", "/boot", "/efi") + (("/etc",) if system == "full" else ()):
            if os.path.isdir(p):
                _mount("--bind", p, p)
                _mount("-o", "remount,bind,ro", p)


if __name__ == "__main__":
    spec_text, sep, *argv = sys.argv[1:]
    assert sep == "--", sys.argv
    apply(json.loads(spec_text))
    os.execvp(argv[0], argv)
