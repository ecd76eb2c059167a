"""The devcluster's accounting: a private MariaDB and a slurmdbd, both inside the cluster's state directory.

Real clusters run slurmdbd, and Slurm behaves differently without it: with accounting_storage/none a
running job refuses every update of itself after its first resize ("the DB index is being set"). So the
local cluster runs the same stack, on private loopback ports, with nothing read from or written to /etc:
MariaDB runs with --no-defaults so the system's /etc/mysql is never read, and slurmdbd reads
slurmdbd.conf from the directory of $SLURM_CONF (it has no -f option), mode 600 as it demands.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpresilience import proc
from hpresilience.errors import EnvironmentMissing, ExternalError
from hpresilience.log import get_logger
from hpresilience.testing import slurmroot

log = get_logger("hpresilience.devcluster")

APT_LINE = "apt-get install -y slurmdbd mariadb-server"
TOOLS = {
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-client",
    "slurmdbd": "slurmdbd",
}
DB_NAME = "slurm_acct_db"


class AccountingError(ExternalError):
    """MariaDB or slurmdbd of the local cluster could not be started; the message carries their log tail."""


def _which(name: str) -> str | None:
    # Daemons live in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"]))


def missing_tools() -> list[str]:
    """The accounting programs that are not installed (empty when accounting can run)."""
    return [t for t in TOOLS if _which(t) is None]


def _tool(name: str) -> str:
    found = _which(name)
    if found is None:
        raise EnvironmentMissing(f"`{name}` not found (Debian package {TOOLS[name]}); install accounting: {APT_LINE}")
    return found


def dbd_argv() -> list[str]:
    """slurmdbd, with the MariaDB client library a Slurm root provides for it where its own one fails."""
    compat = Path(slurmroot.COMPAT_DIR)
    if (compat / "libmariadb.so.3").exists():
        return ["/usr/bin/env", f"LD_LIBRARY_PATH={compat}", _tool("slurmdbd")]
    return [_tool("slurmdbd")]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class Accounting:
    """MariaDB + slurmdbd for one devcluster. `spawn` starts a daemon with the cluster's process marker."""

    def __init__(self, state_dir: Path, db_port: int, dbd_port: int, spawn: Callable[[list[str], bool], None]) -> None:
        self.state_dir = state_dir
        self.db_port = db_port
        self.dbd_port = dbd_port
        self._spawn = spawn
        # Whether a TCP port on 127.0.0.1 listens where the daemons run (a netns cluster checks inside its namespace).
        self.listening: Callable[[int], bool] = port_open

    @property
    def datadir(self) -> Path:
        return self.state_dir / "db" / "data"

    @property
    def tmpdir(self) -> Path:
        """MariaDB's temporary files: its own, never the shared /tmp. Two servers sharing a tmpdir clear each other's
        temporary tables at start (seen with two releases' clusters side by side)."""
        return self.state_dir / "db" / "tmp"

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "db" / "mysqld.sock"

    @property
    def password_file(self) -> Path:
        return self.state_dir / "db" / "slurm.password"

    def pidfiles(self) -> dict[str, Path]:
        return {"mariadbd": self.state_dir / "db" / "mariadbd.pid", "slurmdbd": self.state_dir / "slurmdbd.pid"}

    def slurm_conf_settings(self) -> dict[str, str]:
        return {
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": "127.0.0.1",
            "AccountingStoragePort": str(self.dbd_port),
            "JobAcctGatherType": "jobacct_gather/none",
        }

    def render_dbd_conf(self, password: str) -> str:
        d = self.state_dir
        return (
            "\n".join(
                [
                    "# Written by `hpresilience devcluster up`; removed by `down`.",
                    "AuthType=auth/none",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.dbd_port}",
                    "SlurmUser=root",
                    f"PidFile={d}/slurmdbd.pid",
                    f"LogFile={d}/log/slurmdbd.log",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.db_port}",
                    "StorageUser=slurm",
                    f"StoragePass={password}",
                    f"StorageLoc={DB_NAME}",
                ]
            )
            + "\n"
        )

    # -- start ----------------------------------------------------------------------------------------
    def start(self, conf_dir: Path, timeout: float, progress: Callable[[str], None] | None = None) -> None:
        """Initialise the database on first use, start MariaDB, then slurmdbd; wait until slurmdbd listens."""
        for tool in TOOLS:
            _tool(tool)
        (self.state_dir / "db").mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tmpdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fresh = not (self.datadir / "mysql").is_dir()
        if fresh:
            self._install_db(timeout)
        self._spawn(
            [
                _tool("mariadbd"),
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--tmpdir={self.tmpdir}",
                f"--port={self.db_port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.socket_path}",
                "--user=root",
                f"--pid-file={self.pidfiles()['mariadbd']}",
                f"--log-error={self.state_dir}/log/mariadbd.log",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                "--performance-schema=OFF",
                "--skip-name-resolve",
            ],
            True,
        )
        self._wait("MariaDB", lambda: self.socket_path.exists() and self.listening(self.db_port), timeout, progress)
        password = self._ensure_user(fresh, timeout)
        conf = conf_dir / "slurmdbd.conf"
        # slurmdbd refuses a slurmdbd.conf readable by others; create it 600 before the password goes in.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.render_dbd_conf(password))
        os.chmod(conf, 0o600)
        self._spawn(dbd_argv(), False)
        self._wait("slurmdbd", lambda: self.listening(self.dbd_port), timeout, progress)
        log.info("devcluster_accounting_started", db_port=self.db_port, dbd_port=self.dbd_port, fresh=fresh)

    def _install_db(self, timeout: float) -> None:
        self.datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = [
            _tool("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--tmpdir={self.tmpdir}",
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        ]
        res = proc.run(argv, timeout)
        if not res.ok:
            raise AccountingError(res.describe(tail=400))

    def _ensure_user(self, fresh: bool, timeout: float) -> str:
        if not fresh and self.password_file.exists():
            return self.password_file.read_text().strip()
        password = secrets.token_hex(16)
        sql = (
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            f"GRANT ALL ON {DB_NAME}.* TO 'slurm'@'127.0.0.1';FLUSH PRIVILEGES;"
        )
        argv = [_tool("mariadb"), "--no-defaults", f"--socket={self.socket_path}", "-u", "root"]
        res = proc.run(argv, timeout, input_text=sql)
        if not res.ok:
            raise AccountingError(f"creating the slurm database user failed: {res.describe(tail=400)}")
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        return password

    def _wait(
        self, what: str, ready: Callable[[], bool], timeout: float, progress: Callable[[str], None] | None
    ) -> None:
        started = time.monotonic()
        next_report = started + 3.0
        while not ready():
            waited = time.monotonic() - started
            if waited > timeout:
                raise AccountingError(f"{what} not answering after {waited:.0f} s\n" + self.log_tail())
            if progress is not None and time.monotonic() >= next_report:
                progress(f"waiting for {what} ({waited:.0f} s so far)")
                next_report = time.monotonic() + 3.0
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for name in ("mariadbd.log", "slurmdbd.log"):
            f = self.state_dir / "log" / name
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out)


def describe(pids: Mapping[str, int], enabled: bool) -> list[str]:
    """Status lines for `devcluster status`."""
    if not enabled:
        return ["accounting: off (accounting_storage/none)"]
    return [f"{name}: {pids.get(name, 'not running')}" for name in ("mariadbd", "slurmdbd")]
