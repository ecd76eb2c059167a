"""Pure parts of the reservation helpers, on `scontrol show reservation -o` recorded from Slurm 22.05.8 here."""

from __future__ import annotations

from pathlib import Path

from hpresilience.slurm.reservations import configured, minutes, parse_reservations, reboot_program

RECORDED = Path(__file__).parent.parent / "fixtures" / "slurm" / "scontrol_show_reservation_o_22.05.8.txt"


def test_recorded_reservations_parse_to_name_nodes_state_and_flags() -> None:
    gate, site = parse_reservations(RECORDED.read_text())
    assert (gate["ReservationName"], gate["Nodes"], gate["State"]) == ("hpr-gate-n1", "n1", "ACTIVE")
    assert gate["Flags"] == "MAINT,IGNORE_JOBS,SPEC_NODES"
    assert (site["ReservationName"], site["Nodes"], site["State"]) == ("site-maint", "n[1-2]", "INACTIVE")
    assert site["Users"] == "root,nobody"


def test_no_reservations_is_an_empty_list() -> None:
    assert parse_reservations("No reservations in the system\n") == []


def test_unset_config_values_read_as_empty_and_durations_round_up_to_minutes() -> None:
    assert reboot_program({"RebootProgram": "(null)"}) == "" and reboot_program({}) == ""
    assert reboot_program({"RebootProgram": "/sbin/reboot"}) == "/sbin/reboot"
    assert configured(" none ") == ""
    assert (minutes(0.5), minutes(60), minutes(61), minutes(1200)) == (1, 1, 2, 20)
