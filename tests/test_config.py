"""Configuration: defaults with no file, one clear line per mistake naming file and key path."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from hpresilience.autoresume.settings import load_rules_file
from hpresilience.cli import main
from hpresilience.config import Config, config_from_mapping, load_config
from hpresilience.controller.loop import Controller
from hpresilience.controller.providers import ProviderContext, create_provider
from hpresilience.errors import ConfigError
from hpresilience.health.profiles import load_profile
from hpresilience.health.settings import HealthSettings
from hpresilience.reasons import Action
from hpresilience.settings_base import MAX_SECONDS
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Node
from hpresilience.testing.devcluster import DevCluster
from hpresilience.testing.settings import devcluster_settings


def test_defaults_work_without_any_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPRESILIENCE_CONFIG", raising=False)
    cfg = load_config(None)
    assert cfg == Config() and cfg.slurm.command_timeout_s == 30.0 and devcluster_settings(cfg.devcluster).nodes == 4


def test_values_are_read_and_frozen(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  command_timeout_s: 5\ndevcluster:\n  overrides: {SlurmdTimeout: '5'}\n")
    cfg = load_config(p)
    assert cfg.slurm.command_timeout_s == 5
    assert devcluster_settings(cfg.devcluster).overrides == {"SlurmdTimeout": "5"}
    with pytest.raises(ValidationError):
        cfg.slurm.command_timeout_s = 1


def test_unknown_key_names_file_and_path(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  comand_timeout_s: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"{p}: slurm.comand_timeout_s: unknown key"


def test_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm:\n  retries: many\n")
    with pytest.raises(ConfigError, match=r"slurm\.retries: Input should be a valid integer"):
        load_config(p)


def test_garbage_yaml_gives_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("slurm: [unclosed\n  : :\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+, column \d+"):
        load_config(p)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p)


def test_missing_file_is_an_error_not_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("slurm", "command_timeout_s", float("inf")),
        ("slurm", "command_timeout_s", 1e10),  # every Slurm call raised OverflowError past ~9.2e9
        ("agent", "passive_interval_s", float("inf")),  # one cycle, then none, while /healthz said healthy
        ("agent", "passive_interval_s", float("nan")),
        ("controller", "poll_interval_s", 1e300),
        ("autoresume", "replace_timeout_s", float("nan")),
        ("health", "escalation_window_s", float("-inf")),
    ],
)
def test_infinite_nan_and_huge_durations_are_refused(section: str, key: str, value: float) -> None:
    """Issue 14 item 8: accepted, then silently wrong (a sleep that never ends, an OverflowError per call)."""
    with pytest.raises(ConfigError, match=rf"c.yaml: {section}\.{key}: "):
        config_from_mapping({section: {key: value}}, "c.yaml")


def test_nan_or_infinite_numbers_are_refused_in_yaml_too(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("agent:\n  max_out_fraction: .nan\nslurm:\n  retry_backoff_s: .inf\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert "agent.max_out_fraction" in str(err.value) and "slurm.retry_backoff_s" in str(err.value)


def test_ten_years_is_the_longest_duration() -> None:
    cfg = config_from_mapping({"health": {"escalation_window_s": MAX_SECONDS}})
    assert cfg.health.escalation_window_s == MAX_SECONDS
    with pytest.raises(ConfigError, match="at most 315360000"):
        config_from_mapping({"health": {"escalation_window_s": MAX_SECONDS + 1}})


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"slurm": {"retries": True}}, "slurm.retries"),  # was read as 1
        ({"agent": {"max_out_fraction": False}}, "agent.max_out_fraction"),
        ({"agent": {"passive_interval_s": True}}, "agent.passive_interval_s"),
        ({"autoresume": {"runPolicy": {"noRetryExitCodes": [3, True]}}}, "autoresume.runPolicy.noRetryExitCodes"),
    ],
)
def test_true_false_where_a_number_is_expected_is_refused(data: dict[str, object], where: str) -> None:
    """Issue 14 item 10: `retries: true` silently became 1."""
    with pytest.raises(ConfigError, match=rf"{where}: Value error, must be a number, not true/false"):
        config_from_mapping(data, "c.yaml")


def test_fields_that_take_a_bool_still_take_one() -> None:
    cfg = config_from_mapping(
        {"autoresume": {"runPolicy": {"retryOnApplicationError": True}}, "agent": {"dry_run": True}}
    )
    assert cfg.autoresume.run_policy.retry_on_application_error is True and cfg.agent.dry_run is True


# Issue 11 defect 3: the whole file is validated at load, against the registries of checks, providers and gates.

ISSUE_MISTAKES = [
    ("health:\n  checks:\n    gpu.memory: {max_remaps: 3}\n", "health.checks.gpu.memory.max_remaps: unknown key"),
    (
        "controller:\n  groups:\n    - {name: gpu, nodes: ['gpu-*'], provider: ipmi}\n",
        "controller.groups[0].provider: unknown provider 'ipmi'; known: ec2, hyperpod, reboot, script",
    ),
    ("controller:\n  gate: {kind: nonee}\n", "controller.gate.kind: unknown gate 'nonee'; known: command, none, slurm"),
    (
        "controller:\n  groups:\n    - {name: aws, nodes: ['aws-*'], provider: ec2, "
        "options: {launch_tmplate_id: lt-1}}\n",
        "controller.groups[0].options.launch_tmplate_id: unknown key",
    ),
    (
        "controller:\n  default_provider: script\n  default_options: {comand: [x]}\n",
        "controller.default_options.comand: unknown key",
    ),
    ("controller:\n  default_provider: nope\n", "controller.default_provider: unknown provider 'nope'"),
]


@pytest.mark.parametrize(("text", "line"), ISSUE_MISTAKES)
def test_config_show_refuses_what_only_a_daemon_start_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: str
) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    rc = main(["--config", str(p), "config", "show"])
    err = capsys.readouterr().err
    assert rc == 2 and f"{p}: {line}" in err, err


def test_every_mistake_of_a_section_is_told_at_once(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "controller:\n  groups:\n    - {name: a, nodes: ['a-*'], provider: ipmi}\n"
        "    - {name: b, nodes: ['b-*'], provider: script, options: {timeout_s: 5}}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value).splitlines() == [
        f"{p}: controller.groups[0].provider: unknown provider 'ipmi'; known: ec2, hyperpod, reboot, script",
        f"{p}: controller.groups[1].options.command: Field required",
    ]


def test_validating_aws_provider_options_does_not_import_boto3() -> None:
    """boto3 costs a second of start-up: it is imported when an AWS provider acts, not when a file names one."""
    code = (
        "import sys\nfrom hpresilience.config import config_from_mapping\n"
        "config_from_mapping({'controller': {'groups': [{'name': 'a', 'nodes': ['a-*'], 'provider': 'ec2'},"
        " {'name': 'h', 'nodes': ['h-*'], 'provider': 'hyperpod', 'options': {'cluster_name': 'c'}}]}})\n"
        "print('boto3' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


SITE_PROVIDER = """
from hpresilience.settings_base import Section


class IpmiOptions(Section):
    bmc_user: str
    power_cycle: bool = True


class IpmiProvider:
    name = "ipmi"
    Options = IpmiOptions

    def __init__(self, options, context):
        self.options, self.group = options, context.group

    def act(self, node, action):
        return f"ipmi {action} of {node.name} as {self.options.bmc_user} for group {self.group}"


def untyped(options, context):
    class P:
        name = "untyped"

        def act(self, node, action):
            return f"{action} {node.name} with {sorted(options)}"
    return P()


NOT_A_FACTORY = 42
"""


@pytest.fixture()
def site_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A site's provider module in its own directory on sys.path, as an operator would install it."""
    name = f"mysite_ipmi_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SITE_PROVIDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_site_provider_declared_in_the_config_is_accepted_and_used(tmp_path: Path, site_module: str) -> None:
    cfg = config_from_mapping(
        {
            "controller": {
                "state_dir": str(tmp_path / "state"),
                "providers": {"ipmi": f"{site_module}:IpmiProvider", "plain": f"{site_module}:untyped"},
                "groups": [
                    {"name": "gpu", "nodes": ["gpu-*"], "provider": "ipmi", "options": {"bmc_user": "admin"}},
                    {"name": "cpu", "nodes": ["cpu-*"], "provider": "plain", "options": {"anything": 1}},
                ],
            }
        },
        "c.yaml",
    )
    controller = Controller(cfg.controller, SlurmClient())
    node = Node(name="gpu-3", address="10.0.0.3", hostname="gpu-3", states=frozenset({"DOWN"}))
    assert controller.providers["gpu"].act(node, Action.REBOOT) == "ipmi reboot of gpu-3 as admin for group gpu"
    assert controller.providers["cpu"].act(node, Action.REPLACE) == "replace gpu-3 with ['anything']"


@pytest.mark.parametrize(
    ("providers", "group", "line"),
    [
        (
            {"ipmi": "{mod}:IpmiProvider"},
            {"provider": "ipmi", "options": {"bmc_usr": "x"}},
            "controller.groups[0].options.bmc_usr: unknown key",
        ),
        ({"ipmi": "{mod}:IpmiProvider"}, {"provider": "ipmi"}, "controller.groups[0].options.bmc_user: Field required"),
        (
            {"ipmi": "{mod}:IpmiProvider"},
            {"provider": "ipmx"},
            "controller.groups[0].provider: unknown provider 'ipmx'; known: ec2, hyperpod, ipmi, reboot, script",
        ),
        (
            {"ipmi": "{mod}:IpmiProvidr"},
            {"provider": "ipmi"},
            "controller.providers.ipmi: provider 'ipmi': module '{mod}' has no attribute 'IpmiProvidr'",
        ),
        (
            {"ipmi": "{mod}:NOT_A_FACTORY"},
            {"provider": "ipmi"},
            "controller.providers.ipmi: provider 'ipmi': {mod}:NOT_A_FACTORY is not callable",
        ),
        (
            {"ipmi": "{mod}.IpmiProvider"},
            {"provider": "reboot"},
            "controller.providers.ipmi: provider 'ipmi': '{mod}.IpmiProvider' is not 'module:attribute'",
        ),
    ],
)
def test_a_bad_site_provider_or_its_options_name_the_key_path(
    site_module: str, providers: dict[str, str], group: dict[str, object], line: str
) -> None:
    data = {
        "controller": {
            "providers": {k: v.format(mod=site_module) for k, v in providers.items()},
            "groups": [{"name": "gpu", "nodes": ["gpu-*"], **group}],
        }
    }
    with pytest.raises(ConfigError) as err:
        config_from_mapping(data, "c.yaml")
    assert any(ln.startswith(f"c.yaml: {line.format(mod=site_module)}") for ln in str(err.value).splitlines()), err


def test_a_site_provider_is_known_only_where_it_is_declared(site_module: str) -> None:
    """Declared in one file, it does not leak into the registry every other caller sees."""
    config_from_mapping({"controller": {"providers": {"ipmi": f"{site_module}:IpmiProvider"}}})
    with pytest.raises(ConfigError, match="unknown provider 'ipmi'; known: ec2, hyperpod, reboot, script"):
        config_from_mapping({"controller": {"groups": [{"name": "g", "nodes": ["g-*"], "provider": "ipmi"}]}})


def test_every_validation_error_has_one_shape(tmp_path: Path) -> None:
    """Issue 11: four copies of the formatter became one; each former caller says `source: key.path: message`."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("- {name: r, logPattern: x, faultOnMatch: true, bogusKey: 1}\n")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "x.yaml").write_text("name: x\nchecks:\n  gpu.memory: {max_remaps: 3}\n")
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: config_from_mapping({"slurm": {"bogus": 1}}, "c.yaml"), "c.yaml: slurm.bogus: unknown key"),
        (lambda: load_rules_file(rules), f"{rules}: [0].bogusKey: unknown key"),
        (
            lambda: load_profile(HealthSettings(profile_dirs=[str(profiles)]), "x"),
            f"{profiles / 'x.yaml'}: checks.gpu.memory.max_remaps: unknown key",
        ),
        (
            lambda: create_provider("script", {"command": ["x"], "bogus": 1}, ProviderContext(SlurmClient(), "gpu")),
            "controller node group 'gpu', provider 'script': bogus: unknown key",
        ),
    ]
    for call, line in cases:
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value) == line


def test_only_the_one_formatter_reads_validation_errors() -> None:
    """The four copies drifted apart (`[0]` vs `.0`, "(options)" vs "(top level)", `; ` vs new lines): no module
    but settings_base.py may take a ValidationError apart itself."""
    import hpresilience

    package = Path(hpresilience.__file__).parent
    readers = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if ".errors()" in p.read_text() and p.name != "settings_base.py"
    )
    assert readers == []


CONTROLLER_ONLY = {
    "controller": {
        "providers": {"ipmi": "hpr_site_ipmi_not_installed_here:IpmiProvider"},
        "groups": [{"name": "gpu", "nodes": ["n*"], "provider": "ipmi", "options": {"bmc_user": "admin"}}],
    }
}


def test_a_provider_not_installed_on_this_node_loads_and_stops_only_the_controller(tmp_path: Path) -> None:
    """Issue 21 defect 10: a site provider installed on the head node only made every agent and every
    `srun --auto-resume=1` on the compute and login nodes exit 2, since each loads the same file."""
    cfg = config_from_mapping(CONTROLLER_ONLY, "c.yaml")
    with pytest.raises(ConfigError, match="provider 'ipmi': cannot import 'hpr_site_ipmi_not_installed_here'"):
        Controller(cfg.controller.model_copy(update={"state_dir": str(tmp_path)}), SlurmClient())


@pytest.mark.integration
def test_agents_and_the_wrapper_run_with_a_provider_declared_for_the_controller_only(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.autoresume.test_wrapper_integration import Run

    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                **CONTROLLER_ONLY,
                "agent": {"state_dir": str(tmp_path / "agent")},
                "health": {"state_dir": str(tmp_path / "health"), "profile": "generic"},
            }
        )
    )
    env = {"SLURM_CONF": str(cluster.conf_path)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        rc = main(["--config", str(cfg), "agent", "--once", "--node", "n1", "--metrics-address", ""])
    assert rc == 0, capsys.readouterr().err
    (tmp_path / "job").mkdir()
    run = Run(cluster, slurm, tmp_path / "job", "", "echo trained", nodes=1, env={"HPRESILIENCE_CONFIG": str(cfg)})
    assert run.wait_done() == "0", run.err
    assert "trained" in run.out


def test_the_devcluster_section_is_validated_where_a_devcluster_starts_naming_file_and_key(tmp_path: Path) -> None:
    """config.py keeps `devcluster:` as written (no runtime part imports testing/); the devcluster and demo
    commands validate it, and a typo there is one line naming the file and the key path."""
    p = tmp_path / "c.yaml"
    p.write_text("devcluster:\n  nodez: 3\n")
    assert load_config(p).devcluster == {"nodez": 3}
    with pytest.raises(ConfigError, match=r"c\.yaml: devcluster\.nodez: unknown key"):
        devcluster_settings(load_config(p).devcluster, str(p))
    p.write_text("devcluster:\n  nodes: 3\n")
    assert devcluster_settings(load_config(p).devcluster, str(p)).nodes == 3
