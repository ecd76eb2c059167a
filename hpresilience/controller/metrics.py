"""The controller's Prometheus metrics (one registry per Controller, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # From the controller's one query per cycle, which reads only the nodes in trouble: healthy nodes
        # are not in it, and the help text must say so (a dashboard summing it is not the cluster's size).
        self.cluster_nodes = Gauge(
            "hpr_cluster_nodes",
            "Nodes out of service in Slurm (down, fail, drain; failing and draining "
            "included) and nodes under repair, by state (down, fail, drain, or the base "
            "state) and who owns the reason (agent, controller, operator, none); nodes in "
            "service are not counted",
            ["state", "owner"],
            registry=registry,
        )
        self.nodes = Gauge(
            "hpr_controller_nodes", "Nodes known to the controller, by repair step", ["step"], registry=registry
        )
        self.duration = Histogram(
            "hpr_controller_repair_duration_seconds",
            "From a repair request seen to the node resumed",
            ["provider", "action"],
            registry=registry,
            buckets=(10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
        )
        self.failures = Counter(
            "hpr_controller_repair_failures_total",
            "Failed repair attempts (provider error, not back in time, health gate failed)",
            ["provider", "action", "kind"],
            registry=registry,
        )
        self.outcomes = Counter(
            "hpr_controller_repairs_total",
            "Finished repairs by outcome",
            ["provider", "action", "outcome"],
            registry=registry,
        )
        self.gate = Counter("hpr_controller_health_gate_total", "Health gate results", ["result"], registry=registry)
        self.poll = Histogram(
            "hpr_controller_poll_seconds",
            "Time of the one Slurm query per cycle",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        )
        self.last_cycle = Gauge(
            "hpr_controller_last_cycle_timestamp_seconds", "End of the last cycle", registry=registry
        )
        self.cycle_errors = Counter(
            "hpr_controller_cycle_errors_total", "Cycles that failed (Slurm unreachable, ...)", registry=registry
        )
