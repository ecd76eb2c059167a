"""The preemption notice: check_alive() turns False once this job or node is going away.

Sources: a signal (Slurm's `--signal=USR1@120`, or SIGTERM when Slurm preempts or cancels a job), a notice
file the hpresilience agent writes, the `srun --auto-resume` wrapper's notice file ($HPR_NOTICE_FILE), and
the EC2 spot interruption notice from instance metadata. The last is polled in a background thread, and only
when enabled; a file check is a stat() per call.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from types import FrameType
from typing import Any

from hpresilience.log import get_logger
from hpresilience.torch.settings import PreemptionConfig

log = get_logger("hpresilience.torch")


class PreemptionWatcher:
    """Collects preemption notices; `alive()` is cheap enough to call every step."""

    def __init__(self, cfg: PreemptionConfig | None = None) -> None:
        self.cfg = cfg or PreemptionConfig()
        self.reason: str | None = None
        self._stop = threading.Event()
        self._previous: dict[int, Any] = {}
        self._thread: threading.Thread | None = None
        # `srun --auto-resume` names a per-step notice file in a private directory on each node: it appears when
        # the wrapper is about to move the step (grow back, drain); save and exit then (docs/auto-resume.md).
        self._wrapper_notice = os.environ.get("HPR_NOTICE_FILE", "")

    def start(self) -> PreemptionWatcher:
        if threading.current_thread() is threading.main_thread():
            for name in self.cfg.signals:
                sig = signal.Signals[name]
                self._previous[sig] = signal.signal(sig, self._on_signal)
        else:
            log.warning("preemption_signals_not_watched", reason="signal handlers need the main thread")
        if self.cfg.ec2_spot:
            self._thread = threading.Thread(target=self._poll_ec2, name="spot-notice", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only record it: the training loop saves and exits at the next step boundary.
        self._notice(f"signal {signal.Signals(signum).name}")

    def _notice(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.warning("preemption_notice_received", reason=reason)

    def alive(self) -> bool:
        if self.reason is None and self.cfg.notice_file and os.path.exists(self.cfg.notice_file):
            self._notice(f"notice file {self.cfg.notice_file}")
        if self.reason is None and self._wrapper_notice and _ours(self._wrapper_notice):
            self._notice(f"the auto-resume wrapper moves the step ({self._wrapper_notice})")
        return self.reason is None

    def _poll_ec2(self) -> None:
        while not self._stop.is_set() and self.reason is None:
            try:
                action = spot_interruption(self.cfg.ec2_metadata_url)
            except (OSError, ValueError) as err:
                log.debug("spot_notice_poll_failed", error=str(err))
                action = None
            if action is not None:
                self._notice(f"EC2 spot interruption: {action}")
                return
            self._stop.wait(self.cfg.ec2_poll_s)


def _ours(path: str) -> bool:
    """The wrapper's notice: a regular file (not a link) owned by this user; anything else is not trusted."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def spot_interruption(base_url: str, timeout: float = 2.0) -> str | None:
    """The pending spot action ("terminate at <time>"), or None. Uses IMDSv2 (a session token first)."""
    req = urllib.request.Request(
        f"{base_url}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        token = resp.read().decode()
    req = urllib.request.Request(
        f"{base_url}/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode()
    except urllib.error.HTTPError as err:
        if err.code == 404:  # no interruption scheduled
            return None
        raise
    try:
        doc = json.loads(body)
        return f"{doc['action']} at {doc['time']}"
    except (ValueError, KeyError, TypeError):
        log.warning("spot_notice_unreadable", body=body[:200])
        return f"unparsed notice {body[:80]!r}"


_default: PreemptionWatcher | None = None
_default_lock = threading.Lock()


def install(cfg: PreemptionConfig | None = None) -> PreemptionWatcher:
    """Start watching (call early, from the main thread); replaces a watcher installed before."""
    global _default
    with _default_lock:
        if _default is not None:
            _default.stop()
        _default = PreemptionWatcher(cfg).start()
        return _default


def check_alive() -> bool:
    """False once a preemption notice arrived. Installs the default watcher on first use."""
    w = _default
    if w is None:
        w = install()
    return w.alive()
