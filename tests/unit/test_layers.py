"""The project's layers (issue 32; the picture is in docs/ARCHITECTURE.md, "The layers"): a module may import its
own layer and those below it, never one above. The graph is the one ``test_import_cycles`` builds: module-level
imports and those under ``if TYPE_CHECKING:`` (a type a lower layer names from a higher one is still a dependency
a reader must follow upward), function-local imports left out.

Each layer is a list of packages (a module belongs to the longest prefix that names it); every package's click
commands (``<package>.commands``) belong to the command line's layer, whatever package holds them. A new package
must be placed here: a module in no layer fails the test."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_cycles import graph

# Lowest first. Packages in one layer may import each other (no cycle among modules, test_import_cycles).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("arceusd.base", "arceusd")),  # "arceusd" alone: the package's __init__ (its __version__)
    ("wire and planning", ("protocol", "partitioner")),
    ("files, models, data", ("arceusd.files", "arceusd.models", "arceusd.data")),
    ("network", ("arceusd.transport", "arceusd.membership", "arceusd.network", "arceusd.elections")),
    ("work", ("arceusd.device", "arceusd.jobs", "arceusd.worker", "arceusd.market", "arceusd.dashboard")),
    ("daemon", ("arceusd.daemon",)),
    ("command line", ("arceusd.cli", "arceusd.__main__", "arceus")),
)
COMMAND_LINE = len(LAYERS) - 1


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index of ``module``'s layer (0 the lowest), or None when no layer names it."""
    if module.rsplit(".", 1)[-1] == "commands":
        return len(layers) - 1
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if prefix == "arceusd" and module != "arceusd":
                continue  # the root names only its own __init__, not everything under it
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward(edges: dict[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Each import of a higher layer's module, as 'importer (layer) -> imported (layer)'."""
    out = []
    for importer in sorted(edges):
        mine = layer_of(importer, layers)
        for imported in sorted(edges[importer]):
            theirs = layer_of(imported, layers)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{importer} ({layers[mine][0]}) -> {imported} ({layers[theirs][0]})")
    return out


def test_the_layer_check_finds_an_upward_import() -> None:
    layers = (("low", ("p.low",)), ("high", ("p.high",)), ("cli", ("p.cli",)))
    edges = {"p.low.a": {"p.high.b"}, "p.high.b": {"p.low.c"}, "p.low.c": set(), "p.high.commands": {"p.cli.x"}}
    assert upward(edges, layers) == ["p.low.a (low) -> p.high.b (high)"], "commands modules sit in the top layer"
    assert layer_of("p.high.commands", layers) == 2
    assert layer_of("arceusd.jobs.core.states") == 4 and layer_of("arceusd") == 0 and layer_of("arceusd.cli") == 6


def test_every_module_has_a_layer() -> None:
    edges = graph()
    assert len(edges) > 200, "the graph did not find the project's modules"
    missing = sorted(m for m in edges if layer_of(m) is None)
    assert missing == [], "modules in no layer (place their package in LAYERS): " + ", ".join(missing)


def test_no_layer_imports_a_higher_one() -> None:
    found = upward(graph())
    assert found == [], "imports of a higher layer (module level and TYPE_CHECKING):\n" + "\n".join(found)


# Inside arceusd.jobs, lowest first (the map is in arceusd/jobs/__init__.py): the spec and the pure judging import
# nothing of the job's I/O; the core only those two; nothing below the leader's, the member's and the service's
# side imports them. leader/ and member/ share a layer and import nothing of each other (SEPARATE_ROOMS): where one
# side calls the other (this device's own reports taken by the leader's report_intake, its own worker started by
# the leader's starting) the call is a callable in the caller's port (issue 32), wired by the service.
JOB_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("spec", ("arceusd.jobs.spec",)),
    ("judging", ("arceusd.jobs.judging",)),
    ("core", ("arceusd.jobs.core",)),
    ("plans", ("arceusd.jobs.plans",)),
    ("child processes", ("arceusd.jobs.procs",)),
    ("record", ("arceusd.jobs.record",)),
    ("common", ("arceusd.jobs.common",)),
    ("leader and member", ("arceusd.jobs.leader", "arceusd.jobs.member")),
    ("service", ("arceusd.jobs.service",)),
)


def jobs_edges() -> dict[str, set[str]]:
    """The graph's edges among arceusd.jobs' modules (its own __init__, a map with no imports, left out)."""
    inside = "arceusd.jobs."
    return {m: {d for d in ds if d.startswith(inside)} for m, ds in graph().items() if m.startswith(inside)}


def test_every_jobs_module_has_a_room() -> None:
    edges = jobs_edges()
    assert len(edges) > 50, "the graph did not find the jobs modules"
    missing = sorted(m for m in edges if layer_of(m, JOB_LAYERS) is None)
    assert missing == [], "jobs modules in no subpackage of JOB_LAYERS (place them): " + ", ".join(missing)


def test_no_jobs_room_imports_a_higher_one() -> None:
    edges = jobs_edges()
    assert layer_of("arceusd.jobs.core.machine", JOB_LAYERS) == 2, "the core sits above the spec and the judging"
    found = upward(edges, JOB_LAYERS)
    assert found == [], "jobs imports of a higher room (module level and TYPE_CHECKING):\n" + "\n".join(found)


SEPARATE_ROOMS: tuple[tuple[str, str], ...] = (("arceusd.jobs.leader", "arceusd.jobs.member"),)
"""Rooms of one layer that import nothing of each other, in either direction."""


def crossing(edges: dict[str, set[str]], rooms: tuple[tuple[str, str], ...] = SEPARATE_ROOMS) -> list[str]:
    """Each import between two rooms that must stay apart, as 'importer -> imported'."""

    def inside(module: str, room: str) -> bool:
        return module == room or module.startswith(room + ".")

    return [
        f"{importer} -> {imported}"
        for importer in sorted(edges)
        for imported in sorted(edges[importer])
        for one, other in rooms
        if (inside(importer, one) and inside(imported, other)) or (inside(importer, other) and inside(imported, one))
    ]


def test_the_crossing_check_finds_an_import_either_way() -> None:
    edges = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.c"}, "p.b.z": {"p.a"}, "p.ab.w": {"p.b.y"}}
    assert crossing(edges, (("p.a", "p.b"),)) == ["p.a.x -> p.b.y", "p.b.z -> p.a"], "p.ab is not inside p.a"


def test_the_leader_and_the_member_import_nothing_of_each_other() -> None:
    found = crossing(jobs_edges())
    assert found == [], "imports between the leader's and the member's side (module level and TYPE_CHECKING):\n" + (
        "\n".join(found)
    )


# Who receives which job message (the rooms by role, issue 32): a handler (a function taking the sender's ``Header``
# and one of these messages) of what only members receive is never in leader/, and of what only the leader receives
# never in member/; every message the composition root registers is in one of the three sets.
MEMBER_RECEIVES = frozenset(
    {"JobAnnounce", "JobStart", "JobGo", "JobStop", "JobDropReplica", "JobGrowReplica", "StandbySync", "LinkEcho"}
    | {"SpeedChallenge", "ChallengeGo", "ChallengeOpen"}
)
LEADER_RECEIVES = frozenset({"JoinRequest", "JobReport", "StandbyHeld"})
EITHER_RECEIVES = frozenset({"ShardRequest", "ResumeRequest", "DataRequest", "WeightsRequest", "LendQuery"})
JOBS = Path(__file__).resolve().parents[2] / "arceusd" / "jobs"


def handlers(source: str) -> list[tuple[str, str]]:
    """(function, message type) for each function of ``source`` whose parameters are annotated ``Header`` and a
    message type (a name in the three sets above)."""
    known = MEMBER_RECEIVES | LEADER_RECEIVES | EITHER_RECEIVES
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [ast.unparse(a.annotation).strip("'\"") for a in node.args.args if a.annotation is not None]
            if "Header" in names:
                out += [(node.name, n) for n in names if n in known]
    return out


def test_the_handler_check_finds_a_handler() -> None:
    source = (
        "class A:\n    async def on_x(self, header: Header, msg: JobStart) -> None: ...\n    def f(self, m: JobGo): ..."
    )
    assert handlers(source) == [("on_x", "JobStart")], "only a function that takes the sender's Header is a handler"


def test_no_room_handles_a_message_the_other_side_receives() -> None:
    found = []
    for room, foreign in (("leader", MEMBER_RECEIVES), ("member", LEADER_RECEIVES)):
        for path in sorted((JOBS / room).glob("*.py")):
            found += [f"{room}/{path.name}: {f} takes {m}" for f, m in handlers(path.read_text()) if m in foreign]
    assert found == [], "handlers in the wrong room (move them to the side that receives the message):\n" + (
        "\n".join(found)
    )
    manager = ast.parse((JOBS / "service" / "manager.py").read_text())
    registered = {
        ast.unparse(call.args[0])
        for call in ast.walk(manager)
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("peers.register") and call.args
    }
    assert len(registered) > 15, "the manager's registrations were not found"
    unplaced = registered - MEMBER_RECEIVES - LEADER_RECEIVES - EITHER_RECEIVES
    assert not unplaced, f"messages the manager registers that no set above places: {sorted(unplaced)}"
