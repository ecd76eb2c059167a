"""The metrics server and sd_notify: what daemons expose to Prometheus and systemd."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from hpresilience.errors import ConfigError
from hpresilience.metrics import MetricsServer, parse_address, write_textfile
from hpresilience.systemd import notify, watchdog_interval_s


def test_metrics_and_healthz_are_served() -> None:
    reg = CollectorRegistry()
    Counter("hpr_test_total", "t", registry=reg).inc(3)
    healthy = [True]
    srv = MetricsServer(reg, "127.0.0.1:0", lambda: healthy[0]).start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        assert "hpr_test_total 3.0" in urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert exc.value.code == 503
    finally:
        srv.stop()


@pytest.mark.parametrize("bad", ["nonsense", "host:", "host:99999"])
def test_bad_address_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        parse_address(bad)


def test_textfile_is_written_atomically(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    Counter("hpr_restarts_total", "t", registry=reg).inc()
    out = tmp_path / "prom" / "job.prom"
    write_textfile(reg, str(out))
    assert "hpr_restarts_total 1.0" in out.read_text() and not list(out.parent.glob("*.tmp"))


def test_notify_sends_to_the_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert notify("READY=1", "STATUS=checking")
        assert sock.recv(100) == b"READY=1\nSTATUS=checking"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert notify("READY=1") is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 15.0
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval_s() is None


@pytest.mark.parametrize("taken", ["port in use", "address this host lacks"])
def test_metrics_bind_failure_is_logged_not_raised(taken: str) -> None:
    """Issue 14 item 7: a bind failure crashed the agent and the controller at start, which systemd's
    Restart=on-failure turned into a crash loop with no checks run. Now: one error line, no server."""
    from structlog.testing import capture_logs

    from hpresilience.metrics import start_metrics_server

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}" if taken == "port in use" else "[2001:db8::1]:9761"
        with capture_logs() as logs:
            assert start_metrics_server(CollectorRegistry(), address, lambda: True, "agent") is None
    assert [(e["event"], e["log_level"], e["address"]) for e in logs] == [
        ("metrics_server_not_started", "error", address)
    ]
