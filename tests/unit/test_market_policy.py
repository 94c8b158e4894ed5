"""The owner's policy: its file table and checks, the pure evaluation (unit and property tests), and the
probes read from a folder that stands in for /proc, /sys and the commands' output."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arceusd.device.config import load_config
from arceusd.market.policy import (
    DEFAULT_POLICY,
    LAPTOP,
    JobFacts,
    Policy,
    PolicyError,
    Reason,
    evaluate,
    in_hours,
    lend_reasons,
    owner_back,
)
from arceusd.market.policy_file import load_policy, save_policy, set_values
from arceusd.market.probes import (
    FolderCommands,
    LinuxProbe,
    MacProbe,
    Snapshot,
    parse_interrupts_input,
    parse_loginctl_idle,
    parse_pid_stat_ticks,
    parse_pmset_batt,
    parse_proc_stat,
    probe_for,
)

OWNER = "ab" * 16
IDLE = Snapshot(idle_s=3600.0, on_ac=True, battery_percent=90.0, owner_cpu_percent=3.0, local_hour=2)
JOB = JobFacts(owner=OWNER, model_params=1_000_000, price_per_hour=0.3)


def reasons(policy: Policy, snap: Snapshot, job: JobFacts = JOB) -> set[Reason]:
    return {r.reason for r in evaluate(policy, snap, job).refusals}


def test_an_idle_plugged_machine_lends() -> None:
    assert evaluate(Policy(), IDLE, JOB).accept
    assert str(evaluate(Policy(), IDLE, JOB)) == "accept"


def test_every_failed_condition_is_named() -> None:
    busy = Snapshot(idle_s=20.0, on_ac=False, battery_percent=30.0, owner_cpu_percent=80.0, local_hour=14)
    policy = replace(LAPTOP, hours=(22, 7), owners=("cd" * 16,), max_model_params=1000, min_price_per_hour=1.0)
    assert reasons(policy, busy) == {
        Reason.NOT_IDLE,
        Reason.ON_BATTERY,
        Reason.LOW_BATTERY,
        Reason.OWNER_CPU,
        Reason.HOURS,
        Reason.OWNER_NOT_ALLOWED,
        Reason.MODEL_TOO_LARGE,
        Reason.PRICE_TOO_LOW,
    }
    text = str(evaluate(policy, busy, JOB))
    assert "idle 20 s < 300 s" in text and "30% < 50%" in text and "$0.3000/h < $1.0000/h" in text


def test_unknown_conditions_pass_and_the_switch_stops_everything() -> None:
    unknown = Snapshot(None, None, None, None, 12)
    assert evaluate(Policy(), unknown, JOB).accept
    assert reasons(Policy(lend=False), IDLE) == {Reason.OFF}


def test_a_plugged_machine_lends_whatever_its_battery() -> None:
    assert evaluate(LAPTOP, Snapshot(3600.0, True, 10.0, 0.0, 2), JOB).accept
    assert reasons(replace(LAPTOP, require_ac=False), Snapshot(3600.0, False, 10.0, 0.0, 2)) == {Reason.LOW_BATTERY}


def test_hours_wrap_past_midnight() -> None:
    assert in_hours((22, 7), 23) and in_hours((22, 7), 0) and in_hours((22, 7), 6)
    assert not in_hours((22, 7), 7) and not in_hours((22, 7), 12)
    assert in_hours((9, 17), 9) and not in_hours((9, 17), 17)
    assert in_hours((), 5) and in_hours((3, 3), 5)


def test_owner_back() -> None:
    assert not owner_back(LAPTOP, IDLE)
    assert owner_back(LAPTOP, Snapshot(0.5, True, 90.0, 3.0, 2))
    assert owner_back(LAPTOP, Snapshot(3600.0, False, 90.0, 3.0, 2))  # unplugged
    assert not owner_back(DEFAULT_POLICY, Snapshot(0.0, False, 5.0, 100.0, 2))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"idle_minutes": -1}, "idle_minutes"),
        ({"max_cores": -2}, "max_cores"),
        ({"hours": (1, 2, 3)}, "hours"),
        ({"owners": ("nope",)}, "owners"),
        ({"min_price_per_hour": float("nan")}, "min_price_per_hour"),
        ({"max_owner_cpu_percent": 101.0}, "percentages"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(PolicyError, match=key):
        Policy(**kwargs)  # type: ignore[arg-type]


snapshots = st.builds(
    Snapshot,
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.floats(0, 100)),
    st.one_of(st.none(), st.floats(0, 100)),
    st.integers(0, 23),
)
policies = st.builds(
    Policy,
    idle_minutes=st.floats(0, 120),
    require_ac=st.booleans(),
    min_battery_percent=st.floats(0, 100),
    max_owner_cpu_percent=st.floats(0, 100),
    min_price_per_hour=st.floats(0, 5),
)


@given(policies, snapshots, st.floats(0, 10), st.floats(0, 10))
def test_a_higher_price_is_never_refused_where_a_lower_is_accepted(
    policy: Policy, snap: Snapshot, a: float, b: float
) -> None:
    lo, hi = sorted((a, b))
    if evaluate(policy, snap, JobFacts(OWNER, 10, lo)).accept:
        assert evaluate(policy, snap, JobFacts(OWNER, 10, hi)).accept


@given(policies, snapshots, st.floats(0, 1e6))
def test_more_idle_time_never_hurts(policy: Policy, snap: Snapshot, extra: float) -> None:
    if snap.idle_s is None:
        return
    longer = Snapshot(snap.idle_s + extra, snap.on_ac, snap.battery_percent, snap.owner_cpu_percent, snap.local_hour)
    assert {r.reason for r in lend_reasons(policy, longer)} <= {r.reason for r in lend_reasons(policy, snap)}


@given(policies, snapshots)
def test_owner_back_is_exactly_a_failed_lending_condition(policy: Policy, snap: Snapshot) -> None:
    assert owner_back(policy, snap) == (not evaluate(policy, snap, JobFacts(OWNER, 0, 1e9)).accept)


# --- the file ----------------------------------------------------------------------------------------------
def test_policy_table_round_trips_and_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('preset = "local"\nport = 0\n\n[policy]\nidle_minutes = 3\n')
    assert load_policy(path).idle_minutes == 3.0
    assert load_config(tmp_path).preset == "local"  # the daemon's reader skips [policy]
    new = set_values(load_policy(path), ["hours=[22, 7]", "require_ac=false", f'owners=["{OWNER}"]'])
    save_policy(path, new)
    assert load_policy(path) == new
    assert new.idle_minutes == 3.0 and new.hours == (22, 7) and new.owners == (OWNER,)
    assert 'preset = "local"' in path.read_text() and path.read_text().count("[policy]") == 1
    assert load_config(tmp_path).port == 0


@pytest.mark.parametrize(
    "table, message",
    [
        ("bogus = 1", "unknown key policy.bogus"),
        ("require_ac = 1", "require_ac must be a boolean"),
        ('idle_minutes = "x"', "idle_minutes must be a number"),
        ("hours = 5", "hours must be a list"),
        ("hours = [25, 1]", "hours in 0..24"),
    ],
)
def test_policy_file_errors_name_the_key(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[policy]\n{table}\n")
    with pytest.raises(PolicyError, match=message.replace(".", r"\.")):
        load_policy(path)


# --- probes ------------------------------------------------------------------------------------------------
PROC_STAT = "cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"
INTERRUPTS = """           CPU0       CPU1
  1:        {kbd}          3   IO-APIC    1-edge      i8042
 12:        100          0   IO-APIC   12-edge      i8042
 16:        999        999   IO-APIC   16-fasteoi   ehci_hcd:usb1
"""


def fake_root(tmp_path: Path, *, mains: str = "1", capacity: str = "80", kbd: int = 10) -> Path:
    root = tmp_path / "machine"
    for name, files in {
        "AC": {"type": "Mains", "online": mains},
        "BAT0": {"type": "Battery", "capacity": capacity, "status": "Charging"},
    }.items():
        d = root / "sys/class/power_supply" / name
        d.mkdir(parents=True, exist_ok=True)
        for k, v in files.items():
            (d / k).write_text(v + "\n")
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/stat").write_text(PROC_STAT.format(busy=1000, idle=9000))
    (root / "proc/interrupts").write_text(INTERRUPTS.format(kbd=kbd))
    (root / "commands").mkdir(exist_ok=True)
    return root


def test_linux_probe_reads_the_folder(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root / "proc/4242").mkdir()
    (root / "proc/4242/stat").write_text("4242 (python3 -m x) S " + " ".join(["0"] * 10) + " 100 50 0 0\n")
    probe = LinuxProbe(root, FolderCommands(root), own_pids=lambda: [4242])
    first = probe.snapshot(1000.0)
    assert first.on_ac is True and first.battery_percent == 80.0 and first.owner_cpu_percent is None
    assert first.idle_s == 0.0  # idle counts from the first reading
    # 1000 ticks later: 400 busy, of which Arceus's own process used 150 -> the owner used 25%
    (root / "proc/stat").write_text(PROC_STAT.format(busy=1400, idle=9600))
    (root / "proc/4242/stat").write_text("4242 (python3 -m x) S " + " ".join(["0"] * 10) + " 200 100 0 0\n")
    second = probe.snapshot(1060.0)
    assert second.owner_cpu_percent == pytest.approx(25.0)
    assert second.idle_s == 60.0  # the keyboard's count did not move
    (root / "proc/interrupts").write_text(INTERRUPTS.format(kbd=11))
    assert probe.snapshot(1070.0).idle_s == 0.0  # a key was pressed
    assert probe.snapshot(1100.0).idle_s == 30.0


def test_linux_probe_prefers_logind(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root / "commands/loginctl-list-sessions").write_text("  3 1000 alice seat0 tty2\n c1  0 root\n")
    (root / "commands/loginctl-show-session-3").write_text("IdleHint=yes\nIdleSinceHint=1000000000\n")
    (root / "commands/loginctl-show-session-c1").write_text("IdleHint=yes\nIdleSinceHint=1500000000\n")
    probe = LinuxProbe(root, FolderCommands(root))
    assert probe.snapshot(2000.0).idle_s == 500.0  # the session idle the shortest time counts
    (root / "commands/loginctl-show-session-3").write_text("IdleHint=no\nIdleSinceHint=0\n")
    assert probe.snapshot(2000.0).idle_s == 0.0


def test_unplugging_is_seen(tmp_path: Path) -> None:
    root = fake_root(tmp_path, mains="0", capacity="40")
    snap = LinuxProbe(root, FolderCommands(root)).snapshot(time.time())
    assert snap.on_ac is False and snap.battery_percent == 40.0
    assert owner_back(replace(LAPTOP, idle_minutes=0), snap)


def test_mac_probe_reads_command_outputs(tmp_path: Path) -> None:
    root = tmp_path / "mac"
    (root / "commands").mkdir(parents=True)
    (root / "commands/pmset-g-batt").write_text(
        "Now drawing from 'Battery Power'\n -InternalBattery-0 (id=4653155)\t72%; discharging; 5:01 remaining "
        "present: true\n"
    )
    (root / "commands/ioreg-IOHIDSystem").write_text(
        '    | |   "HIDIdleTime" = 42000000000\n    | |   "HIDKeyboardModifierMappingPairs" = ()\n'
    )
    (root / "commands/ps-cpu").write_text(f"    1   0.5\n  {os.getpid()}  300.0\n  77  12.0\n")
    probe = probe_for(str(root), own_pids=lambda: [os.getpid()])
    assert isinstance(probe, MacProbe)
    snap = probe.snapshot(time.time())
    assert snap.on_ac is False and snap.battery_percent == 72.0 and snap.idle_s == 42.0
    assert snap.owner_cpu_percent == pytest.approx(12.5 / (os.cpu_count() or 1))


def test_parsers_refuse_garbage() -> None:
    assert parse_proc_stat("nonsense") is None
    assert parse_proc_stat("cpu 1 2 x 4") is None
    assert parse_pid_stat_ticks("no paren") is None
    assert parse_interrupts_input("CPU0\n 16: 5 ehci\n") is None
    assert parse_loginctl_idle("IdleHint=maybe\n", 10.0) is None
    assert parse_loginctl_idle("garbage", 10.0) is None
    assert parse_pmset_batt("") == (None, None)


# --- the terms as the dashboard's device page shows them (issue 31) ----------------------------------------------
def test_each_term_says_what_the_machine_shows_and_whether_it_is_met() -> None:
    from arceusd.market.policy import lend_terms, policy_terms

    policy = replace(LAPTOP, max_owner_cpu_percent=50.0, hours=(22, 7), min_price_per_hour=0.002, max_cores=2)
    snap = Snapshot(idle_s=20.0, on_ac=True, battery_percent=80.0, owner_cpu_percent=13.861386138613861, local_hour=2)
    terms = {t.key: t for t in policy_terms(policy, snap, threads=4, prices=[0.001, 0.0035])}
    assert terms["max_owner_cpu_percent"].now == "owner CPU 14% <= 50%" and terms["max_owner_cpu_percent"].met
    assert terms["idle_minutes"].asks == "idle at least 5 min" and terms["idle_minutes"].now == "idle 20 s < 300 s"
    assert terms["idle_minutes"].met is False
    assert terms["hours"].now == "hour 2 in 22-7" and terms["hours"].met
    assert terms["min_price_per_hour"].asks == "floor price $0.0020/h"
    assert terms["min_price_per_hour"].now == "1 of 2 announced job(s) pay at least $0.0020/h"
    assert terms["min_price_per_hour"].met is True
    assert terms["max_cores"].met is False and terms["max_cores"].now == "workers use 4 thread(s) > 2"
    assert terms["owners"].met is None and terms["require_ac"].met and terms["min_battery_percent"].met
    assert "probe_root" not in terms
    # the page's "met" and the daemon's decision are one fact: a machine term fails exactly where a reason is given
    assert [t.key for t in lend_terms(policy, snap) if not t.met] == ["idle_minutes"]
    assert [r.reason for r in lend_reasons(policy, snap)] == [Reason.NOT_IDLE]
    unpriced = {t.key: t for t in policy_terms(policy, snap, 2, None)}
    assert unpriced["min_price_per_hour"].now == "not known yet"
    assert {t.key: t for t in policy_terms(policy, snap, 2, [])}["min_price_per_hour"].met is None
    assert unpriced["receipt_grace_s"].asks == "a checkpoint's receipt is due 60 s after it"


@given(policies, snapshots)
def test_a_machine_term_is_unmet_exactly_when_the_policy_refuses(policy: Policy, snap: Snapshot) -> None:
    from arceusd.market.policy import lend_terms

    assert sum(1 for t in lend_terms(policy, snap) if not t.met) == len(lend_reasons(policy, snap))
