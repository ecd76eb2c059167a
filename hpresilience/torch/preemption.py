"""The preemption notice: check_alive() turns False once this job or node is going away.

Sources: a signal (Slurm's `--signal=USR1@120`, or SIGTERM when Slurm preempts or cancels a job), the node
notice file the hpresilience agent writes on a cloud reclaim or maintenance notice (/run/hpresilience/
notice.json by default; trusted only when root owns it and its directory, so a user on a shared node cannot
stop another's job by creating it), the `srun --auto-resume` wrapper's notice file ($HPR_NOTICE_FILE, trusted
only when it is this user's own regular file in a directory only this user can enter), and the EC2 spot
interruption notice from instance metadata. The last is polled in a background thread, and only when
enabled; a file check is an lstat() per call while no file is there.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from types import FrameType
from typing import Any

from hpresilience.errors import HPResilienceError
from hpresilience.imds import SPOT_PATH, MetadataClient
from hpresilience.log import get_logger
from hpresilience.torch.settings import PreemptionConfig

log = get_logger("hpresilience.torch")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class PreemptionWatcher:
    """Collects preemption notices; `alive()` is cheap enough to call every step."""

    def __init__(self, cfg: PreemptionConfig | None = None) -> None:
        self.cfg = cfg or PreemptionConfig()
        self.reason: str | None = None
        self._stop = threading.Event()
        self._previous: dict[int, Any] = {}
        self._thread: threading.Thread | None = None
        self._ignored = ""
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
        if self.reason is None and self.cfg.notice_file:
            why = untrusted_notice(self.cfg.notice_file)
            if why is None:
                self._notice(f"notice file {self.cfg.notice_file}")
            elif why and why != self._ignored:
                self._ignored = why  # said once per distinct cause, not every step
                log.warning("notice_file_ignored", path=self.cfg.notice_file, why=why)
        if self.reason is None and self._wrapper_notice and _ours(self._wrapper_notice):
            self._notice(f"the auto-resume wrapper moves the step ({self._wrapper_notice})")
        return self.reason is None

    def _poll_ec2(self) -> None:
        while not self._stop.is_set() and self.reason is None:
            try:
                action = spot_interruption(self.cfg.ec2_metadata_url)
            except (HPResilienceError, ValueError) as err:  # no answer, or one that is not text: no news
                log.debug("spot_notice_poll_failed", error=str(err))
                action = None
            if action is not None:
                self._notice(f"EC2 spot interruption: {action}")
                return
            self._stop.wait(self.cfg.ec2_poll_s)


def untrusted_notice(path: str, owner: int = 0) -> str | None:
    """None when `path` is a notice to act on: a regular file (not a link) that `owner` (root: the agent)
    owns and only it can write, in a directory `owner` owns that nobody else can write. "" when there is no
    file (the common case: one lstat per call); else why it is not trusted, e.g. a user's file planted in a
    world-writable directory on a shared node. The directory and the file are judged in one resolution
    (the file through the directory's descriptor), so a path swapped between the two checks cannot pair a
    trusted directory with a file found elsewhere."""
    try:
        os.lstat(path)
    except OSError:
        return ""
    with _Parent(path) as (parent, dfd, name):
        if dfd < 0:
            return f"directory {parent} is not a plain directory (a link?) or unreadable"
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return ""  # gone meanwhile
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid != owner or st.st_mode & 0o022:
            return (
                f"file owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o} (want uid {owner}, not "
                f"writable by others)"
            )
        dst = os.fstat(dfd)
        if dst.st_uid != owner or dst.st_mode & 0o022:
            return (
                f"directory {parent} owned by uid {dst.st_uid} with mode {stat.S_IMODE(dst.st_mode):o} "
                f"(want uid {owner}, not writable by others)"
            )
    return None


class _Parent:
    """`with _Parent(path) as (parent, dfd, name)`: the directory holding `path`, opened without following a
    link in its last part (dfd -1 when that fails), closed on exit."""

    def __init__(self, path: str) -> None:
        self.parent, self.name = os.path.split(os.path.abspath(path))
        self.dfd = -1

    def __enter__(self) -> tuple[str, int, str]:
        try:
            self.dfd = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)
        except OSError:
            self.dfd = -1
        return self.parent, self.dfd, self.name

    def __exit__(self, *exc: object) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)


def _ours(path: str) -> bool:
    """The wrapper's notice: a regular file (not a link) owned by this user, in the directory the wrapper made
    for it (ours, 0700: nobody else could have put it there); anything else is not trusted."""
    try:
        os.lstat(path)
    except OSError:
        return False
    me = os.getuid()
    with _Parent(path) as (_, dfd, name):
        if dfd < 0:
            return False
        dst = os.fstat(dfd)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return False
        return dst.st_uid == me and not dst.st_mode & 0o077 and stat.S_ISREG(st.st_mode) and st.st_uid == me


def spot_interruption(base_url: str, timeout: float = 2.0) -> str | None:
    """The pending spot action ("terminate at <time>"), or None. IMDSv2 through the one metadata client
    (hpresilience/imds.py, the agent's too): each request ends within `timeout` in all."""
    client = MetadataClient(base_url, timeout, "torch preemption ec2_metadata_url")
    body = client.get(SPOT_PATH, client.token())
    if body is None:  # no interruption scheduled
        return None
    text = body.decode()
    try:
        doc = json.loads(text)
        return f"{doc['action']} at {doc['time']}"
    except (ValueError, KeyError, TypeError):
        # Conservative on purpose: a notice we cannot read is still a notice to save and stop.
        log.warning("spot_notice_unreadable", body=text[:200])
        return f"unparsed notice {text[:80]!r}"


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
