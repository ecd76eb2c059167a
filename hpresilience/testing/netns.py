"""Nodes as separate hosts (`devcluster up --isolation netns`): network namespaces, a bridge, faults on links.

Layout of one cluster (every name carries its base port, so clusters of different users/ports coexist):

    hpr<port>-ctl   slurmctld (and MariaDB + slurmdbd) and the bridge `br0`, address 10.77.0.1/24
    hpr<port>-n1    node n1: `eth0` 10.77.0.11/24, the peer of `vn1` on the bridge; slurmd runs here in a PID
                    namespace of its own with its own /proc (nsinit.py is its PID 1)
    ...

Every address and link lives in the cluster's own namespaces (the veth pairs are created from inside `ctl` straight
into the node's namespace). The host reaches the cluster by entering `ctl` (`nsenter --net=/run/netns/hpr<port>-ctl`):
the devcluster's client, `devcluster exec` and the tests do. The one thing added to the host's own network is a guard:
while any netns cluster exists, the host routes the cluster subnet nowhere (`unreachable 10.77.0.0/24`), so a client
run on the host with the cluster's slurm.conf fails at once (EHOSTUNREACH) instead of sending the cluster's traffic
out through the host's default route to whatever answers there. It is added only where that subnet would otherwise
leave by a gateway, and taken away with the last cluster.
A partition sets the node's bridge port down (the node's processes keep running, its TCP connections stall as
behind a dead switch port); a slow link is netem on both ends of the node's veth pair (the delay each way).
`destroy` finds the namespaces by their name prefix, so `down` also cleans what a crashed `up` left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from enum import Enum
from pathlib import Path

import psutil

from hpresilience import proc
from hpresilience.errors import ConfigError, EnvironmentMissing, ExternalError
from hpresilience.proc import Result
from hpresilience.slurm.runner import CommandRunner

SUBNET = "10.77.0"
CTL_ADDR = f"{SUBNET}.1"
# With a backup controller each slurmctld has a host name of its own (a UTS namespace): Slurm picks a daemon's role
# by matching its host name against the SlurmctldHost lines, and reads `localhost` as whatever host it runs on.
PRIMARY_NAME = "ctl1"
BACKUP_NAME = "ctl2"
BACKUP_ADDR = f"{SUBNET}.2"
_SET_HOSTNAME = "import os,socket,sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
BRIDGE = "br0"
NODE_IF = "eth0"
NETNS_DIR = Path("/run/netns")
# The host's guard route (see the module's docstring); a `proto` of our own marks it as ours, so `down` never removes
# a route a site added for the same subnet.
GUARD_NET = f"{SUBNET}.0/24"
GUARD_PROTO = "250"  # a free routing-protocol number (rt_protos reserves up to 4 for the kernel's own)
_CTL_NAME = re.compile(r"^hpr\d+-ctl$")
GUARD_LOCK = "/run/hpresilience-netns-guard.lock"  # root's /run: the namespaces are root's alone
IP_TIMEOUT_S = 10.0
APT_HINT = "apt-get install -y iproute2 util-linux"


class Isolation(Enum):
    """How the devcluster's nodes are separated: `none` shares the host's network and process table (loopback
    addresses); `netns` gives each node its own network and PID namespace."""

    NONE = "none"
    NETNS = "netns"

    @classmethod
    def parse(cls, text: str) -> Isolation:
        for i in cls:
            if i.value == text.strip():
                return i
        raise ConfigError(f"unknown isolation {text!r}; known: {', '.join(i.value for i in cls)}")


class NamespaceRunner(CommandRunner):
    """Runs the Slurm commands inside a network namespace (a netns cluster's controller side), unchanged otherwise."""

    def __init__(self, ns_prefix: list[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.ns_prefix = ns_prefix

    def execute(
        self, argv: list[str], timeout: float, env: Mapping[str, str], cwd: str | None, input_text: str | None
    ) -> Result:
        return super().execute([*self.ns_prefix, *argv], timeout, env, cwd, input_text)


class NetnsError(ExternalError):
    """A namespace, link or qdisc could not be set up or changed; the message carries the command's error."""


def prefix(base_port: int) -> str:
    return f"hpr{base_port}-"


def ctl_ns(base_port: int) -> str:
    return f"{prefix(base_port)}ctl"


def backup_ns(base_port: int) -> str:
    return f"{prefix(base_port)}ctl2"


def with_hostname(name: str) -> list[str]:
    """argv prefix running a command in a UTS namespace of its own under the host name `name`."""
    return ["unshare", "--uts", sys.executable, "-I", "-S", "-c", _SET_HOSTNAME, name]


def node_ns(base_port: int, node: str) -> str:
    return f"{prefix(base_port)}{node}"


def node_addr(index: int) -> str:
    """1-based node index -> its address on the cluster's bridge."""
    return f"{SUBNET}.{10 + index}"


def bridge_port(node: str) -> str:
    return f"v{node}"  # inside ctl only: interface names are per namespace


def enter(ns: str) -> list[str]:
    """argv prefix running a command in the namespace's network (mounts and /sys untouched, unlike `ip netns exec`,
    which remounts /sys and would hide the cgroup hierarchies Slurm's proctrack/cgroup needs)."""
    return ["nsenter", f"--net={NETNS_DIR / ns}"]


def check_tools() -> None:
    missing = [t for t in ("ip", "tc", "nsenter", "unshare") if not _which(t)]
    if missing:
        raise EnvironmentMissing(f"{', '.join(missing)} not found (needed by --isolation netns): {APT_HINT}")
    if os.geteuid() != 0:
        raise EnvironmentMissing("--isolation netns needs root (network and PID namespaces)")


def _which(tool: str) -> str | None:
    for d in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.access(f"{d}/{tool}", os.X_OK):
            return f"{d}/{tool}"
    return None


def _run(*argv: str) -> proc.Result:
    res = proc.run(list(argv), IP_TIMEOUT_S)
    if not res.ok:
        raise NetnsError(f"`{' '.join(argv)}` failed: {res.describe(tail=300)}")
    return res


def existing(base_port: int) -> list[str]:
    """The namespaces of the cluster on this base port (whatever made them: an `up` that crashed included)."""
    res = proc.run(["ip", "netns", "list"], IP_TIMEOUT_S)
    names = [line.split()[0] for line in res.stdout.splitlines() if line.strip()] if res.ok else []
    return sorted(n for n in names if n.startswith(prefix(base_port)))


def create(base_port: int, nodes: list[str], backup: bool = False) -> None:
    """Namespaces, the bridge and one veth pair per node, all links up. Raises NetnsError (after removing what it
    made) when any step fails."""
    check_tools()
    ctl = ctl_ns(base_port)
    try:
        with _guard_lock():
            # The namespace first: a `destroy` elsewhere that looks for clusters left then sees this one.
            _run("ip", "netns", "add", ctl)
            guard_host()
        _run("ip", "-n", ctl, "link", "set", "lo", "up")
        _run("ip", "-n", ctl, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", ctl, "addr", "add", f"{CTL_ADDR}/24", "dev", BRIDGE)
        _run("ip", "-n", ctl, "link", "set", BRIDGE, "up")
        for i, node in enumerate(nodes, start=1):
            ns = node_ns(base_port, node)
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run(
                "ip", "-n", ctl, "link", "add", bridge_port(node), "type", "veth", "peer", "name", NODE_IF, "netns", ns
            )
            _run("ip", "-n", ctl, "link", "set", bridge_port(node), "master", BRIDGE)
            _run("ip", "-n", ctl, "link", "set", bridge_port(node), "up")
            _run("ip", "-n", ns, "addr", "add", f"{node_addr(i)}/24", "dev", NODE_IF)
            _run("ip", "-n", ns, "link", "set", NODE_IF, "up")
        if backup:  # the backup controller's host: one more port on the bridge
            ns = backup_ns(base_port)
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ctl, "link", "add", "vctl2", "type", "veth", "peer", "name", NODE_IF, "netns", ns)
            _run("ip", "-n", ctl, "link", "set", "vctl2", "master", BRIDGE)
            _run("ip", "-n", ctl, "link", "set", "vctl2", "up")
            _run("ip", "-n", ns, "addr", "add", f"{BACKUP_ADDR}/24", "dev", NODE_IF)
            _run("ip", "-n", ns, "link", "set", NODE_IF, "up")
    except BaseException:
        destroy(base_port)
        raise


def destroy(base_port: int) -> list[str]:
    """Kill whatever still runs in the cluster's namespaces and delete them (their links go with them)."""
    gone = existing(base_port)
    for ns in gone:
        res = proc.run(["ip", "netns", "pids", ns], IP_TIMEOUT_S)
        for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        proc.run(["ip", "netns", "del", ns], IP_TIMEOUT_S)
    # Only a destroy that removed a cluster may take the guard away: a devcluster inside a Slurm root (a chroot on
    # the host's network) lists no namespaces at all, and must not drop the guard of the host's netns clusters.
    if gone:
        with _guard_lock():
            if not clusters_left():
                unguard_host()
    return gone


@contextlib.contextmanager
def _guard_lock() -> Iterator[None]:
    """One cluster's create or destroy at a time decides on the host's guard route (clusters on other ports, in
    parallel test workers, come and go together)."""
    fd = os.open(GUARD_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clusters_left() -> bool:
    """Whether any netns cluster (on any base port) still has its controller namespace."""
    res = proc.run(["ip", "netns", "list"], IP_TIMEOUT_S)
    return any(_CTL_NAME.match(line.split()[0]) for line in res.stdout.splitlines() if line.strip()) if res.ok else True


def host_route(addr: str = CTL_ADDR) -> str:
    """`ip route get` of a cluster address in the host's own namespace ('' when the kernel has no route at all)."""
    res = proc.run(["ip", "route", "get", addr], IP_TIMEOUT_S)
    return res.stdout.strip() if res.ok else ""


def guarded() -> bool:
    res = proc.run(["ip", "route", "show", "type", "unreachable", GUARD_NET, "proto", GUARD_PROTO], IP_TIMEOUT_S)
    return res.ok and bool(res.stdout.strip())


def guard_host() -> None:
    """Route the cluster subnet nowhere in the host's namespace, where it would otherwise leave by a gateway."""
    if guarded() or " via " not in f" {host_route()} ":
        return  # ours already, or a route of the host's own (a site network on that subnet) that we leave alone
    _run("ip", "route", "add", "unreachable", GUARD_NET, "proto", GUARD_PROTO)


def unguard_host() -> None:
    if guarded():
        proc.run(["ip", "route", "del", "unreachable", GUARD_NET, "proto", GUARD_PROTO], IP_TIMEOUT_S)


def _known(base_port: int, node: str) -> None:
    if node_ns(base_port, node) not in existing(base_port):
        raise ConfigError(
            f"node {node!r} has no namespace {node_ns(base_port, node)}: is the cluster up with --isolation netns?"
        )


def partition(base_port: int, node: str) -> None:
    """Cut the node off: its bridge port goes down; the node's processes keep running."""
    _known(base_port, node)
    _run("ip", "-n", ctl_ns(base_port), "link", "set", bridge_port(node), "down")


def heal(base_port: int, node: str) -> None:
    _known(base_port, node)
    _run("ip", "-n", ctl_ns(base_port), "link", "set", bridge_port(node), "up")


def is_partitioned(base_port: int, node: str) -> bool:
    res = _run("ip", "-n", ctl_ns(base_port), "-o", "link", "show", bridge_port(node))
    flags = re.search(r"<([^>]*)>", res.stdout)
    return flags is None or "UP" not in flags.group(1).split(",")


def slow(base_port: int, node: str, delay_ms: int) -> None:
    """Delay every packet to and from the node by `delay_ms` each way (netem on both ends of its link); 0 removes it."""
    if delay_ms < 0:
        raise ConfigError(f"--delay-ms must be >= 0, not {delay_ms}")
    _known(base_port, node)
    ends = [(ctl_ns(base_port), bridge_port(node)), (node_ns(base_port, node), NODE_IF)]
    for ns, dev in ends:
        if delay_ms == 0:
            res = proc.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], IP_TIMEOUT_S)
            if (
                not res.ok
                and "No such file" not in res.stderr
                and "Cannot delete qdisc with handle of zero" not in res.stderr
            ):
                raise NetnsError(f"removing the delay of {node} failed: {res.describe(tail=300)}")
            continue
        res = proc.run(
            ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{delay_ms}ms"], IP_TIMEOUT_S
        )
        if not res.ok:
            hint = (
                " (this kernel has no sch_netem: the netem qdisc is a kernel module, CONFIG_NET_SCH_NETEM)"
                if "qdisc kind is unknown" in res.stderr
                else ""
            )
            raise NetnsError(f"netem on {node} failed{hint}: {res.stderr.strip()[:300]}")


def netem_usable() -> str:
    """'' when this kernel has netem, else the exact error (tried on a scratch namespace, removed after)."""
    ns = f"hpr-netem-probe-{os.getpid()}"
    try:
        if not proc.run(["ip", "netns", "add", ns], IP_TIMEOUT_S).ok:
            return "cannot create a network namespace"
        res = proc.run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], IP_TIMEOUT_S)
        return "" if res.ok else res.stderr.strip() or res.describe()
    finally:
        proc.run(["ip", "netns", "del", ns], IP_TIMEOUT_S)


def listening(ns: str, port: int) -> bool:
    """Whether a TCP socket listens on `port` inside the namespace (its /proc/net/tcp, read from within)."""
    res = proc.run([*enter(ns), "cat", "/proc/net/tcp", "/proc/net/tcp6"], IP_TIMEOUT_S)
    want = f":{port:04X}"
    for line in res.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[1].endswith(want) and fields[3] == "0A":  # 0A: TCP_LISTEN
            return True
    return False


def slurmd_pids(names: Sequence[str], marker: str, value: str) -> dict[str, int]:
    """name -> host pid of each node's slurmd running in its PID namespace (its pid file holds the pid inside it):
    found by the cluster's environment marker and `-N name`."""
    out: dict[str, int] = {}
    wanted = set(names)
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            argv = p.info["cmdline"] or []
            if p.info["name"] != "slurmd" or "-N" not in argv:
                continue
            at = argv.index("-N") + 1
            name = argv[at] if at < len(argv) else ""
            if name in wanted and p.environ().get(marker) == value:
                out[name] = p.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return out
