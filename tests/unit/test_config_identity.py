"""Config presets, TOML file and flag precedence; identity key creation and peer id derivation."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from arceusd.base.identity import IdentityError, load_or_create_identity, peer_id_from_public_key, verify_signature
from arceusd.device.config import ConfigError, load_config, parse_host_port


def test_presets_and_precedence(tmp_path: Path) -> None:
    assert load_config(tmp_path).preset == "lan"
    local = load_config(tmp_path, {"preset": "local"})
    assert (local.port, local.listen_host, local.mdns) == (0, "127.0.0.1", False)
    (tmp_path / "config.toml").write_text('preset = "local"\nport = 5000\npeers = ["10.0.0.1:47070"]\n')
    cfg = load_config(tmp_path)
    assert (cfg.preset, cfg.port, cfg.peers) == ("local", 5000, ("10.0.0.1:47070",))
    assert load_config(tmp_path, {"port": 6000, "log_level": None}).port == 6000


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("prot = 1\n", "unknown key 'prot'"),
        ('port = "x"\n', "port must be int"),
        ("port = true\n", "port must be an integer"),
        ("port = 70000\n", "0..65535"),
        ('preset = "wan"\n', "preset must be one of"),
        ('peers = ["nohost"]\n', "not host:port"),
        ("port = [\n", "not valid TOML"),
    ],
)
def test_bad_config_file_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        load_config(tmp_path)


def test_parse_host_port() -> None:
    assert parse_host_port("[::1]:80") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_host_port("host:0")


def test_identity_is_created_once_with_0600_and_stable_id(tmp_path: Path) -> None:
    first = load_or_create_identity(tmp_path)
    key = tmp_path / "identity.key"
    assert os.stat(key).st_mode & 0o777 == 0o600
    second = load_or_create_identity(tmp_path)
    assert first.peer_id == second.peer_id == peer_id_from_public_key(first.public_key_raw)
    assert first.peer_id == hashlib.sha256(first.public_key_raw).digest()[:16].hex()
    assert verify_signature(first.public_key_raw, first.sign(b"x"), b"x")
    assert not verify_signature(first.public_key_raw, first.sign(b"x"), b"y")


def test_identity_refuses_wrong_key_type_and_directories(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

    pem = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key = tmp_path / "identity.key"
    key.write_bytes(pem)
    key.chmod(0o600)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        load_or_create_identity(tmp_path)
    assert key.read_bytes() == pem
    other = tmp_path / "other"
    (other / "identity.key").mkdir(parents=True)
    with pytest.raises(IdentityError, match="not a regular file"):
        load_or_create_identity(other)


def test_lend_memory_caps_from_file_and_flag_and_refuses_negative(tmp_path: Path) -> None:
    assert load_config(tmp_path).lend_memory_mib == 0
    (tmp_path / "config.toml").write_text("lend_memory_mib = 2048\n")
    assert load_config(tmp_path).lend_memory_mib == 2048
    assert load_config(tmp_path, {"lend_memory_mib": 512}).lend_memory_mib == 512
    with pytest.raises(ConfigError, match="lend_memory_mib must be >= 0"):
        load_config(tmp_path, {"lend_memory_mib": -1})
    (tmp_path / "config.toml").write_text('lend_memory_mib = "lots"\n')
    with pytest.raises(ConfigError, match="lend_memory_mib must be int"):
        load_config(tmp_path)
