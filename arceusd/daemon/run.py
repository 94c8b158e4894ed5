"""The daemon: loads identity and config, opens every service in one nursery, and stops cleanly on a signal.

Nothing else lives here. Each service is an ``async def serve_x(node, *, task_status)`` that reports readiness
through ``nursery.start`` and registers its status section and control methods on the
:class:`~arceusd.device.node.Node`.

Shutdown: SIGTERM or SIGINT (or the ``shutdown`` control method) cancels the nursery; services clean up in their
``finally`` blocks (shielded, bounded) and the process exits 0 well within 5 s.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import trio

from arceusd import __version__
from arceusd.base.control_server import serve_control
from arceusd.base.failures import one_line
from arceusd.base.fdlimit import raise_nofile
from arceusd.base.identity import Identity, IdentityError, load_or_create_identity
from arceusd.base.logs import setup_logging
from arceusd.base.paths import StatePaths
from arceusd.daemon.network_service import serve_peer_network
from arceusd.dashboard.service import serve_dashboard
from arceusd.device.config import DaemonConfig
from arceusd.device.node import Node
from arceusd.jobs.service.manager import serve_jobs
from arceusd.market.service import serve_market

log = logging.getLogger("arceusd")

EXIT_OK = 0
EXIT_CONFIG = 2


def run(config: DaemonConfig) -> int:
    """Run a daemon in the foreground until it is asked to stop; return the process exit code.

    Error handling: a start-up failure (state directory, key, taken port, interface, control socket) is one line
    on stderr and in the log, and exit code 2; anything unexpected is one line and 1. At ``log_level = debug``
    the exception propagates with its traceback.
    """
    setup_logging(config.log_level, config.log_file)
    raise_nofile()  # the soft open-files limit up to the hard one: the peer port's budget is sized from it
    paths = StatePaths(config.state_dir)
    try:
        paths.ensure()
        _check_writable(paths)
        identity = load_or_create_identity(config.state_dir)
    except IdentityError as exc:
        return _fail(f"{exc}", EXIT_CONFIG, config.log_file is not None)
    except OSError as exc:
        return _fail(
            f"cannot use the state directory {config.state_dir}: {(exc.strerror or str(exc)).lower()}; "
            "choose a writable one with --state-dir DIR (or $ARCEUS_STATE_DIR)",
            EXIT_CONFIG,
            config.log_file is not None,
        )
    try:
        return trio.run(_main, config, identity)
    except Exception as exc:
        if config.log_level == "debug":
            raise
        message, code = one_line(exc)
        return _fail(message, code, config.log_file is not None)


def _fail(message: str, code: int, to_log: bool) -> int:
    print(f"arceusd: {message}", file=sys.stderr)
    if to_log:  # without a log file the log is this same stderr: one line, not two
        log.error("%s", message)
    return code


def _check_writable(paths: StatePaths) -> None:
    """Fail now, with the state directory's name, rather than later on the first file a service writes."""
    probe = paths.root / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


async def _main(config: DaemonConfig, identity: Identity) -> int:
    node = Node(identity=identity, config=config)
    paths = node.paths
    _write_pid_file(paths)
    try:
        async with trio.open_nursery() as nursery:

            async def shutdown(_params: dict[str, Any]) -> dict[str, Any]:
                log.info("shutdown requested over the control socket")
                nursery.start_soon(_graceful_stop, node, nursery.cancel_scope)
                return {"stopping": True}

            async def status(_params: dict[str, Any]) -> dict[str, Any]:
                return node.status()

            node.methods.update({"status": status, "shutdown": shutdown})
            nursery.start_soon(_stop_on_signal, node, nursery.cancel_scope)
            for service in _services():
                await nursery.start(service, node)
            await nursery.start(serve_control, paths.control_socket, node.methods)
            node.addresses["control"] = str(paths.control_socket)
            node.started.set()  # the peer service joins the cluster now (PeerService.activate)
            log.info(
                "arceusd %s ready: peer %s, state %s, addresses %s",
                __version__,
                identity.peer_id,
                config.state_dir,
                node.addresses,
            )
    finally:
        _remove_pid_file(paths)
    log.info("arceusd stopped")
    return EXIT_OK


def _services() -> list[Any]:
    """The services a daemon runs, in start order (each ``async def (node, *, task_status)``)."""
    return [serve_peer_network, serve_jobs, serve_market, serve_dashboard]


async def _stop_on_signal(node: Node, cancel_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, stopping", signal.Signals(signum).name)
            await _graceful_stop(node, cancel_scope)
            return


async def _graceful_stop(node: Node, cancel_scope: trio.CancelScope) -> None:
    """Run the services' shutdown hooks (leave the cluster, hand off work), bounded to 3 s, then cancel all."""
    with trio.move_on_after(3.0):
        for hook in reversed(node.shutdown_hooks):
            try:
                await hook()
            except Exception:
                log.exception("a shutdown hook failed; stopping anyway")
    cancel_scope.cancel()


def _write_pid_file(paths: StatePaths) -> None:
    tmp = paths.pid_file.with_name(paths.pid_file.name + ".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, paths.pid_file)


def _remove_pid_file(paths: StatePaths) -> None:
    try:
        if paths.pid_file.read_text().strip() == str(os.getpid()):
            paths.pid_file.unlink()
    except (FileNotFoundError, ValueError):
        pass
