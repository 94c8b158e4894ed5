"""The job's standby: the plan member that can lead the job when its leader dies.

A leader is the only device that holds the data set (it serves the batches) and it signs the checkpoints, so
survivors without it have nothing to train on. Each plan therefore names a *standby* (``JobStart.standby``):
after every committed checkpoint the leader sends it a :class:`protocol.job_wire.StandbySync` with the signed
manifest and the names of every shard but the standby's own (so each shard has three copies: its writer's, the
leader's and the standby's), and, once, the names of the data files. The standby copies
them (``ShardRequest`` / ``DataRequest``), checks every shard against the manifest and the data against the
spec's ``data.sha256``, and stores them where a leader keeps them. The job's election ranks the leader first
and the standby second, so when membership declares the leader dead and a majority of the plan agrees, the
standby wins the next term, re-slices its own complete copy (any shard it lacks, it fetches from the survivors)
and carries on
(:meth:`arceusd.jobs.service.manager.JobManager.take_over`).

This module owns the file side of that: which files a leader's data set consists of, where the standby keeps
its copy and what its worker's data entry then says, the check of the copy, and the members' offers (with
their measured calibration) that the leader hands the standby to plan with if it takes over. File work only;
the daemon runs it in a thread: the copying in :mod:`arceusd.jobs.common.transfers`, the synchronisation that decides
what is sent in :mod:`arceusd.jobs.leader.standby_sync`, what the standby accepts in
:mod:`arceusd.jobs.member.standby_copy`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from arceusd.data.mnist_files import find_mnist_files
from arceusd.data.text_files import file_sha256
from arceusd.jobs.plans.job_paths import JobPaths
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.spec.datafacts import mnist_facts

DATA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
"""What a data file copied to the standby may be called: a plain file name, no path, no leading dot."""


class StandbyError(ValueError):
    """A standby sync names files it may not, or a data copy does not match the spec's digest."""


def data_files(data: Mapping[str, Any]) -> list[Path]:
    """The files of a resolved data entry (``{"kind": "text", "path"}`` or ``{"kind": "mnist", "dir", ...}``),
    in the order a standby copies them: the text file; the MNIST images then labels."""
    if data.get("kind") == "text":
        return [Path(str(data["path"]))]
    if data.get("kind") == "tokens":  # the text and its tokenizer.json
        return [Path(str(data["path"])), Path(str(data["tokenizer"]))]
    folder = Path(str(data["dir"]))
    images, labels = data.get("images"), data.get("labels")
    if not images or not labels:
        found = find_mnist_files(folder)
        return [found[0], found[1]]
    return [folder / str(images), folder / str(labels)]


def check_names(kind: str, names: Sequence[str]) -> None:
    """Refuse data file names that are not plain names or whose count does not fit the data kind."""
    want = 1 if kind == "text" else 2
    if len(names) != want:
        raise StandbyError(f"a {kind} data set is {want} file(s); the leader named {len(names)}")
    for name in names:
        if not DATA_NAME.match(name):
            raise StandbyError(f"data file name {name!r} is not a plain file name")
    if len(set(names)) != len(names):
        raise StandbyError("the leader named the same data file twice")


def copy_entry(job_dir: Path, data: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The data entry of the standby's copy: the spec's entry with its paths pointing into ``<job>/data``."""
    folder = JobPaths(job_dir).data
    out = dict(data)
    if data.get("kind") == "text":
        out["path"] = str(folder / names[0])
    elif data.get("kind") == "tokens":
        out.update({"path": str(folder / names[0]), "tokenizer": str(folder / names[1])})
    else:
        out.update({"dir": str(folder), "images": names[0], "labels": names[1]})
    return out


def data_digest(data: Mapping[str, Any]) -> str:
    """The content digest the spec's ``data.sha256`` states, computed from the files of ``data`` (a tokens data
    set's: its text file's; the tokenizer has its own, :func:`check_copy`)."""
    files = data_files(data)
    if data.get("kind") in ("text", "tokens"):
        return file_sha256(files[0])
    return mnist_facts(files[0].parent, files[0].name, files[1].name).sha256


def check_copy(data: Mapping[str, Any], expected_sha256: str | None, tokenizer_sha256: str | None = None) -> None:
    """Raise :class:`StandbyError` unless the copy's digest is the spec's (and, for a tokens data set, its
    tokenizer's the spec's ``data.tokenizer_sha256``)."""
    if not expected_sha256:
        raise StandbyError("the spec states no data digest, so a copy cannot be checked")
    try:
        got = data_digest(data)
        got_tokenizer = file_sha256(data_files(data)[1]) if data.get("kind") == "tokens" else None
    except (OSError, ValueError) as exc:
        raise StandbyError(f"the data copy cannot be read: {exc}") from None
    if got != expected_sha256:
        raise StandbyError(f"the data copy's digest is {got}, the spec says {expected_sha256}: refused")
    if data.get("kind") == "tokens" and got_tokenizer != tokenizer_sha256:
        raise StandbyError(f"the tokenizer copy's digest is {got_tokenizer}, the spec says {tokenizer_sha256}: refused")


OFFER_FIELDS = frozenset(f.name for f in dataclasses.fields(Offer))


def offers_to_wire(offers: Iterable[Offer]) -> bytes:
    """The members' offers for the standby (what it plans with if it takes over: the plan's and the spares'),
    as JSON."""
    return json.dumps([dataclasses.asdict(o) for o in offers], sort_keys=True, separators=(",", ":")).encode()


def offers_from_wire(data: bytes, plan: Iterable[str], told: Iterable[str] = ()) -> dict[str, Offer]:
    """Parse :func:`offers_to_wire` output: every offer must be plausible, else :class:`StandbyError` saying which
    field is wrong; only the offers of members the standby knows from its leader are kept (a device of the
    ``plan`` it was started with, or one of the members that start named, ``told``: the spares among them). Others
    are left out, not refused: a member that joined the leader since its last start is in the leader's sync
    before any start names it (refusing the whole sync for it left the standby without the checkpoint)."""
    allowed = {*plan, *told}
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise StandbyError(f"the offers are not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise StandbyError("the offers must be a JSON list")
    out: dict[str, Offer] = {}
    for item in raw:
        if not isinstance(item, dict) or set(item) != OFFER_FIELDS:
            raise StandbyError(f"an offer must have exactly the fields {sorted(OFFER_FIELDS)}")
        for name in ("peer_id", "address", "kind"):
            if not isinstance(item[name], str):
                raise StandbyError(f"offer field {name} must be a string")
        for name in OFFER_FIELDS - {"peer_id", "address", "kind", "memory_bytes"}:
            if isinstance(item[name], bool) or not isinstance(item[name], (int, float)):
                raise StandbyError(f"offer field {name} must be a number, got {item[name]!r}")
        if isinstance(item["memory_bytes"], bool) or not isinstance(item["memory_bytes"], int):
            raise StandbyError("offer field memory_bytes must be an integer")
        offer = Offer(**item)
        try:
            offer.check()  # the same rule as a join's offer
        except ValueError as exc:
            raise StandbyError(str(exc)) from None
        if offer.peer_id in allowed:
            out[offer.peer_id] = offer
    return out


def takeover_offers(
    offers: Mapping[str, Offer], alive: Mapping[str, str], old_leader: str, me: str, admits: Callable[[str], bool]
) -> dict[str, Offer]:
    """Whom a standby that takes over leads, besides itself: of the offers its leader synced (checked by
    :func:`offers_from_wire`), the old plan's devices and its spares (members the plan left out, which the old
    leader had accepted) alive in this device's view, at the address membership has for them now, that the
    spec's admission lets in; never the old leader. Before, only the old plan's devices were kept: a spare was
    never in the job's election, so it was lost to the new leader (issue 31)."""
    return {
        p: dataclasses.replace(o, address=alive[p])
        for p, o in offers.items()
        if p in alive and p not in (old_leader, me) and admits(p)
    }


__all__ = [
    "DATA_NAME",
    "StandbyError",
    "check_copy",
    "check_names",
    "copy_entry",
    "data_digest",
    "data_files",
    "offers_from_wire",
    "offers_to_wire",
    "takeover_offers",
]
