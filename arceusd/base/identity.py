"""A device's Ed25519 identity: the key file on disk and the peer id derived from it.

The private key lives in ``<state_dir>/identity.key`` as an unencrypted PKCS#8 PEM with mode 0600. It is created on
first start and never overwritten: a key file that is unreadable, corrupt, or readable by group/others stops the
daemon with an :class:`IdentityError` that says what is wrong and how to fix it.

The peer id is ``sha256(raw public key)[:16]`` in lowercase hex (32 characters). Anyone holding the public key can
recompute it, so a peer proves its id by signing with the matching key (see the transport handshake).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FILE_NAME = "identity.key"
PEER_ID_BYTES = 16


class IdentityError(Exception):
    """The identity key cannot be used; the message says why and what to do."""


def peer_id_from_public_key(public_key_raw: bytes) -> str:
    """Derive the peer id (32 hex chars) from a raw 32-byte Ed25519 public key."""
    if len(public_key_raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(public_key_raw)}")
    return hashlib.sha256(public_key_raw).digest()[:PEER_ID_BYTES].hex()


def fingerprint(public_key_raw: bytes) -> str:
    """A short human-comparable fingerprint of a public key (first 8 bytes of sha256, hex, colon-grouped)."""
    digest = hashlib.sha256(b"arceus-fingerprint\x00" + public_key_raw).digest()[:8].hex()
    return ":".join(digest[i : i + 4] for i in range(0, len(digest), 4))


def verify_signature(public_key_raw: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``data`` by ``public_key_raw``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key_raw).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """A loaded key pair. ``sign`` is the only use of the private key outside this module."""

    private_key: Ed25519PrivateKey
    public_key_raw: bytes
    peer_id: str

    @classmethod
    def from_private_key(cls, key: Ed25519PrivateKey) -> Identity:
        raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(private_key=key, public_key_raw=raw, peer_id=peer_id_from_public_key(raw))

    @classmethod
    def generate(cls) -> Identity:
        """A fresh in-memory identity (tests, benchmarks)."""
        return cls.from_private_key(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key_raw)


def key_path(state_dir: Path) -> Path:
    return state_dir / KEY_FILE_NAME


def load_or_create_identity(state_dir: Path) -> Identity:
    """Load the device key from ``state_dir``, creating it (mode 0600) when absent.

    Error handling: raises :class:`IdentityError` when the file exists but is not a regular file, is readable or
    writable by group/others, cannot be read, or does not hold an Ed25519 PKCS#8 PEM key. The existing file is left
    untouched in every case.
    """
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = key_path(state_dir)
    if not path.exists() and not path.is_symlink():
        return _create(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise IdentityError(
            f"cannot read the identity key {path}: {exc.strerror}. Check the file and its owner."
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError(f"the identity key {path} is not a regular file. Move it away and start again.")
    if st.st_mode & 0o077:
        raise IdentityError(
            f"the identity key {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"a private key must be private. Fix it with: chmod 600 {path}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IdentityError(
            f"cannot read the identity key {path}: {exc.strerror}. Check the file and its owner."
        ) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(
            f"the identity key {path} is corrupt or not a PEM private key ({exc}). "
            f"Restore it from a backup, or move it away to create a new identity (a new peer id)."
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(
            f"the identity key {path} is not an Ed25519 key. Move it away to create a new identity (a new peer id)."
        )
    return Identity.from_private_key(key)


def _create(path: Path) -> Identity:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    # O_EXCL-like: never replace a key that appeared meanwhile.
    try:
        os.link(tmp, path)
    except FileExistsError:
        os.unlink(tmp)
        return load_or_create_identity(path.parent)
    os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return Identity.from_private_key(key)
