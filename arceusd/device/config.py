"""Daemon configuration: typed, frozen dataclasses with presets, read from TOML and overridden by flags.

Precedence (lowest first): the preset (``lan`` or ``local``), ``<state_dir>/config.toml``, command-line flags.
Unknown keys and wrong types are errors (:class:`ConfigError`) that name the key and what is allowed: a typo in a
config file must not be silently ignored.

The ``lan`` preset follows hashicorp/memberlist's DefaultLANConfig timings; ``local`` is for tests and local
swarms on loopback (tens of milliseconds). Membership timings live in ``arceusd.membership``'s own config; this
module only chooses the preset by name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

from arceusd.base.failures import UserError
from arceusd.worker.affinity import AffinityError, check_cpus, parse_cpu_list

PRESETS = ("lan", "local")
DEVICE_KINDS = ("cpu", "cuda", "mps")
"""What ``devices`` may name (``arceusd.device.profile.available_kinds``' kinds)."""
DEFAULT_PORT = 47070


class ConfigError(UserError):
    """The configuration is invalid; the message names the key and what is allowed."""


@dataclass(frozen=True)
class DaemonConfig:
    """Everything a daemon needs to start. ``port`` 0 lets the OS choose a free port."""

    state_dir: Path
    preset: str = "lan"
    listen_host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    advertise_host: str | None = None
    peers: tuple[str, ...] = ()
    interface: str | None = None
    mdns: bool = True
    log_level: str = "info"
    log_file: Path | None = None
    worker_threads: int = 1
    worker_cpus: tuple[int, ...] = ()
    """Cores this device's stage workers are pinned to (Linux; ``arceusd.worker.affinity``). Empty: not
    pinned, the OS schedules them (the default: the device's owner may be using it too)."""
    auto_join: bool = False
    lend_memory_mib: int = 0
    """The most memory this device offers a job, in MiB (0: whatever is free when it is measured)."""
    dashboard_host: str = "127.0.0.1"
    """Where ``arceusd dashboard`` serves the web dashboard; loopback unless the owner asks otherwise."""
    dashboard_port: int = 0
    """The dashboard's port (0: any free port; the ``dashboard`` control method says which)."""
    devices: tuple[str, ...] = ()
    """The device kinds this daemon may lend (``["cpu"]``: the CPU only, on a machine with a GPU); empty: any
    measured here, the fastest lent."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level must be debug, info, warning or error, got {self.log_level!r}")
        if self.worker_threads < 1:
            raise ConfigError(f"worker_threads must be >= 1, got {self.worker_threads}")
        try:
            check_cpus(self.worker_cpus, self.worker_threads)
        except AffinityError as exc:
            raise ConfigError(f"worker_cpus: {exc}") from None
        if not 0 <= self.dashboard_port <= 65535:
            raise ConfigError(f"dashboard_port must be in 0..65535, got {self.dashboard_port}")
        if self.lend_memory_mib < 0:
            raise ConfigError(f"lend_memory_mib must be >= 0 (0 lends whatever is free), got {self.lend_memory_mib}")
        for peer in self.peers:
            parse_host_port(peer)
        wrong = [k for k in self.devices if k not in DEVICE_KINDS]
        if wrong or len(set(self.devices)) != len(self.devices):
            raise ConfigError(
                f"devices must be distinct kinds from {', '.join(DEVICE_KINDS)} (empty: any), got {list(self.devices)}"
            )


def parse_host_port(value: str) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` too); raise :class:`ConfigError` saying what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"peer {value!r} is not host:port (for example 192.168.1.20:{DEFAULT_PORT})")
    port = int(port_text)
    if not 0 < port <= 65535:
        raise ConfigError(f"peer {value!r}: port must be in 1..65535")
    return host.strip("[]"), port


def preset(name: str, state_dir: Path) -> DaemonConfig:
    """The named preset. ``local`` binds loopback, picks a free port and turns mDNS off unless asked."""
    if name == "lan":
        return DaemonConfig(state_dir=state_dir, preset="lan")
    if name == "local":
        return DaemonConfig(state_dir=state_dir, preset="local", listen_host="127.0.0.1", port=0, mdns=False)
    raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")


_FILE_KEYS: dict[str, type | tuple[type, ...]] = {
    "preset": str,
    "listen_host": str,
    "port": int,
    "advertise_host": str,
    "peers": list,
    "interface": str,
    "mdns": bool,
    "log_level": str,
    "worker_threads": int,
    "worker_cpus": (str, list),
    "auto_join": bool,
    "lend_memory_mib": int,
    "dashboard_host": str,
    "dashboard_port": int,
    "devices": list,
    "policy": dict,
}
"""``[policy]`` is the device owner's lending policy, read by ``arceusd.market.policy_file``, not a daemon
setting."""


def _check_keys(data: dict[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        expected = _FILE_KEYS.get(key)
        if expected is None:
            raise ConfigError(f"{source}: unknown key {key!r}; allowed keys: {', '.join(sorted(_FILE_KEYS))}")
        if isinstance(value, bool) and expected is int:
            raise ConfigError(f"{source}: {key} must be an integer, got a boolean")
        if not isinstance(value, expected):
            raise ConfigError(
                f"{source}: {key} must be {getattr(expected, '__name__', expected)}, got {value!r}; fix that line"
            )
        listed = key in ("peers", "devices")
        out[key] = tuple(str(p) for p in cast("list[object]", value)) if listed else value
    return out


def load_config(state_dir: Path, overrides: dict[str, Any] | None = None) -> DaemonConfig:
    """Preset, then ``config.toml`` in ``state_dir`` (if present), then ``overrides`` (flags; None = not given).

    Error handling: raises :class:`ConfigError` for an unreadable or malformed file, unknown keys, wrong types
    and invalid values.
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    path = state_dir / "config.toml"
    file_values: dict[str, Any] = {}
    if path.exists():
        try:
            with path.open("rb") as fh:
                file_values = _check_keys(tomllib.load(fh), str(path))
            file_values.pop("policy", None)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid TOML: {exc}; fix that line (or move the file away to start with the defaults)"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    preset_name = overrides.get("preset", file_values.get("preset", "lan"))
    base = preset(str(preset_name), state_dir)
    merged: dict[str, Any] = {**file_values, **overrides}
    known = {f.name for f in fields(DaemonConfig)}
    unknown = set(merged) - known
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    if "worker_cpus" in merged:
        merged["worker_cpus"] = _cpus(merged["worker_cpus"])
    return replace(base, **merged)


def _cpus(value: object) -> tuple[int, ...]:
    """``worker_cpus`` from a flag or the file: ``"0,2-3"`` or a list (its entries are checked by
    ``DaemonConfig.__post_init__``)."""
    if not isinstance(value, str):
        return tuple(cast("list[int]", value))
    try:
        return parse_cpu_list(value)
    except AffinityError as exc:
        raise ConfigError(f"worker_cpus: {exc}") from None


def config_summary(config: DaemonConfig) -> dict[str, Any]:
    """A JSON-friendly view of the config (for ``arceusd status --json``)."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        out[f.name] = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
    return out


__all__ = ["DEFAULT_PORT", "ConfigError", "DaemonConfig", "config_summary", "load_config", "parse_host_port", "preset"]
