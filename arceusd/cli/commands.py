"""The ``arceusd`` command line: parses arguments into config and calls into the daemon or its control API.

Every command that talks to a running daemon goes through the control socket in the state directory
(:mod:`arceusd.base.control`); when no daemon runs, it says so in one line and exits non-zero.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from arceusd import __version__
from arceusd.base.control import ControlError, call
from arceusd.base.failures import debug_requested, one_line
from arceusd.base.identity import IdentityError, load_or_create_identity
from arceusd.base.logs import open_private_log, tail
from arceusd.base.paths import default_state_dir
from arceusd.base.text_safety import safe_text, safe_tree
from arceusd.cli.began import process_began
from arceusd.cli.context import EXIT_NO_DAEMON, Context
from arceusd.cli.demo import run_demo
from arceusd.daemon import service
from arceusd.dashboard.commands import register as _register_dashboard
from arceusd.device.config import ConfigError, DaemonConfig, load_config
from arceusd.jobs.record.view import job_line, render_job
from arceusd.jobs.spec.schema import JobSpecError, load_spec
from arceusd.market.commands import print_quote
from arceusd.market.commands import register as _register_market

pass_ctx = click.make_pass_decorator(Context)

STATE_DIR_HELP = "State directory (key, config, sockets, logs). Default: per-platform, or $ARCEUS_STATE_DIR."


def _late_state_dir(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.ensure_object(Context).use_state_dir(value)  # the group's Context, shared by its subcommands


def _state_dir_option(expose: bool) -> click.Option:
    return click.Option(
        ["--state-dir"],
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help=STATE_DIR_HELP,
        expose_value=expose,
        is_eager=not expose,
        callback=None if expose else _late_state_dir,
    )


class StateDirGroup(click.Group):
    """A group whose every subcommand also takes ``--state-dir``, so it works before or after the command name."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not any(isinstance(p, click.Option) and "--state-dir" in p.opts for p in cmd.params):
            cmd.params.append(_state_dir_option(expose=False))
        super().add_command(cmd, name)


@click.group(cls=StateDirGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help=STATE_DIR_HELP)
@click.version_option(__version__, prog_name="arceusd")
@click.pass_context
def cli(ctx: click.Context, state_dir: Path | None) -> None:
    """Arceus: train neural networks together on the computers you already have."""
    ctx.obj = Context((state_dir or default_state_dir()).expanduser().absolute(), explicit=state_dir is not None)


def _start_options(fn: Any) -> Any:
    options = [
        click.option("--preset", type=click.Choice(["lan", "local"]), default=None, help="Timing preset."),
        click.option("--host", "listen_host", default=None, help="Address to listen on for peers."),
        click.option("--port", type=int, default=None, help="Peer port (0 = any free port)."),
        click.option("--advertise-host", default=None, help="Address peers should use to reach this device."),
        click.option("--peer", "peers", multiple=True, help="Static seed peer host:port (repeatable)."),
        click.option("--interface", default=None, help="Network interface for mDNS (default: skip virtual ones)."),
        click.option("--mdns/--no-mdns", default=None, help="Announce and browse on the LAN with mDNS."),
        click.option("--auto-join/--no-auto-join", default=None, help="Join every announced job automatically."),
        click.option(
            "--worker-cpus",
            default=None,
            metavar="LIST",
            help='Pin this device\'s stage workers to these cores (Linux), e.g. 0,2-3; "" = not pinned.',
        ),
        click.option(
            "--lend-memory-mib",
            type=int,
            default=None,
            help="The most memory (MiB) this device offers a job; 0 = whatever is free.",
        ),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None),
        click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _build_config(state_dir: Path, flags: dict[str, Any]) -> DaemonConfig:
    overrides = dict(flags)
    overrides["peers"] = tuple(flags["peers"]) or None
    try:
        return load_config(state_dir, overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _forwarded_args(flags: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in flags.items():
        if value is None or key == "log_file":
            continue
        flag = "--" + {"listen_host": "host"}.get(key, key).replace("_", "-")
        if key == "peers":
            for peer in value:
                args += ["--peer", peer]
        elif key in ("mdns", "auto_join"):
            name = key.replace("_", "-")
            args.append(f"--{name}" if value else f"--no-{name}")
        else:
            args += [flag, str(value)]
    return args


@cli.command()
@click.option("--foreground", is_flag=True, help="Run in this terminal (what the background service runs).")
@click.option("--detach", is_flag=True, help="Run as a detached process with a pid file (no service manager).")
@_start_options
@pass_ctx
def start(obj: Context, /, foreground: bool, detach: bool, **flags: Any) -> None:
    """Start the daemon: as a background service (launchd/systemd), or --foreground / --detach."""
    if foreground and detach:
        raise click.UsageError("choose one of --foreground and --detach")
    config = _build_config(obj.state_dir, flags)
    if foreground:
        from arceusd.daemon.run import run  # heavy: the whole daemon (0.3 s), off the CLI's quick commands

        sys.exit(run(config))
    if detach:
        _start_detached(obj, flags)
        return

    obj.paths.ensure()
    try:
        manager = service.install(obj.state_dir, obj.paths.log_file, _forwarded_args(flags))
    except service.NoServiceManager as exc:
        raise click.ClickException(
            f"cannot install a background service here: {exc}; "
            "run the daemon in this terminal with `arceusd start --foreground`, "
            "or as a detached process with `arceusd start --detach`."
        ) from None
    except service.ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"installed and started the {manager.kind} service ({manager.unit_path})")
    _wait_ready(obj, timeout=20.0)


def _start_detached(obj: Context, flags: dict[str, Any]) -> None:
    obj.paths.ensure()
    if _daemon_pid(obj) is not None:
        raise click.ClickException(f"a daemon is already running for {obj.state_dir} (pid {_daemon_pid(obj)})")
    log_file = flags.get("log_file") or obj.paths.log_file
    command = [
        sys.executable,
        "-m",
        "arceusd",
        "--state-dir",
        str(obj.state_dir),
        "start",
        "--foreground",
        "--log-file",
        str(log_file),
        *_forwarded_args(flags),
    ]

    with os.fdopen(open_private_log(Path(log_file)), "ab") as log:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True
        )
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            reason = _last_failure(Path(log_file))
            raise click.ClickException(
                f"the daemon exited at start: {reason}"
                if reason
                else f"the daemon exited at start (code {proc.returncode}); see `arceusd logs` ({log_file})"
            )
        try:
            status = call(obj.paths.control_socket, "status", timeout=2.0)
        except ControlError:
            time.sleep(0.1)
            continue
        click.echo(f"arceusd started (pid {status['pid']}, peer {status['peer_id']}); logs: {log_file}")
        return
    raise click.ClickException(f"the daemon did not become ready within 20 s; see {log_file}")


def _last_failure(log_file: Path) -> str | None:
    """The one-line reason a detached daemon printed when it failed at start (its stderr goes to the log)."""
    try:
        lines = tail(log_file, 20)
    except OSError:
        return None
    reasons = [line.removeprefix("arceusd: ") for line in lines if line.startswith("arceusd: ")]
    return safe_text(reasons[-1], None) if reasons else None


def _wait_ready(obj: Context, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = call(obj.paths.control_socket, "status", timeout=2.0)
        except ControlError:
            time.sleep(0.2)
            continue
        click.echo(f"arceusd is running (peer {status['peer_id']})")
        return
    raise click.ClickException(f"the service did not become ready within {timeout:.0f} s; see `arceusd logs`")


def _daemon_pid(obj: Context) -> int | None:
    try:
        pid = int(obj.paths.pid_file.read_text().strip())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


@cli.command()
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for a clean exit.")
@pass_ctx
def stop(obj: Context, timeout: float) -> None:
    """Stop the daemon: the background service, or the foreground/detached process."""
    stopped = False
    try:
        manager = service.uninstall()
    except service.ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    if manager is not None:
        click.echo(f"stopped and removed the {manager.kind} service")
        stopped = True
    pid = _daemon_pid(obj)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _daemon_pid(obj) == pid:
            time.sleep(0.05)
        if _daemon_pid(obj) == pid:
            raise click.ClickException(f"the daemon (pid {pid}) did not stop within {timeout:.0f} s")
        click.echo(f"stopped arceusd (pid {pid})")
        stopped = True
    if not stopped:
        click.echo(f"arceusd: no daemon is running for {obj.state_dir}", err=True)
        sys.exit(EXIT_NO_DAEMON)


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@cli.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Keep refreshing (Ctrl-C to stop).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
@pass_ctx
def status(obj: Context, job: str | None, as_json: bool, watch: bool, interval: float) -> None:
    """Show the daemon (peer id, version, uptime, addresses, peers, jobs), or one JOB in detail."""
    if watch and not as_json:  # the rich live view (arceusd.dashboard.watch)
        from arceusd.dashboard.watch import watch as live_view  # rich: only for --watch, off the CLI's start

        try:
            return live_view(obj.call, job, interval)
        except KeyboardInterrupt:
            return
    if job is not None:
        try:
            while True:
                # --json carries every loss point (machines read the curve); the text view needs the recent ones
                result = obj.call("job", {"job_id": job, "history": "all"} if as_json else {"job_id": job})
                if as_json:
                    click.echo(json.dumps(result, indent=2, sort_keys=True))
                else:
                    if watch:
                        click.clear()
                    click.echo(render_job(safe_tree(result)))
                if not watch or result["state"] in ("done", "failed", "cancelled"):
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
    result = obj.call("status")
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    result = safe_tree(result)  # every string a peer may have chosen, escaped for the terminal
    click.echo(f"arceusd {result['version']}  peer {result['peer_id']}  (fingerprint {result['fingerprint']})")
    click.echo(f"  up {_fmt_duration(result['uptime_s'])}, pid {result['pid']}, preset {result['preset']}")
    click.echo(f"  state  {result['state_dir']}")
    for name, address in sorted(result["addresses"].items()):
        click.echo(f"  {name:<8} {address}")
    if result.get("device"):
        click.echo(f"  device {result['device']}")
    for line in _status_extras(result):
        click.echo(line)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def peers(obj: Context, as_json: bool) -> None:
    """Show the membership view: each peer's state, incarnation, round-trip time, last heard, device."""
    _echo_list(
        obj.call("peers"), as_json, _peer_line, "no peers known yet (same LAN with mDNS, or --peer host:port seeds)"
    )


def _echo_list(result: list[dict[str, Any]], as_json: bool, line: Any, empty: str) -> None:
    """Print a list result as JSON, or one formatted line per item (``empty`` when there is none)."""
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    if not result:
        click.echo(empty)
    for item in safe_tree(result):  # remote strings (device, names, addresses) escaped for the terminal
        click.echo(line(item))


def _status_extras(result: dict[str, Any]) -> list[str]:
    """Lines for sections added by services (peers, jobs); each service formats its own section."""
    lines: list[str] = []
    peers = result.get("peers")
    if isinstance(peers, list):
        lines.append(f"  peers  {len(peers)} known")
        lines += [f"    {_peer_line(p)}" for p in peers]
    jobs = result.get("jobs")
    if isinstance(jobs, list):
        lines.append(f"  jobs   {len(jobs)}")
        lines += [f"    {job_line(j)}" for j in jobs]
    market = result.get("market")
    left = market.get("left_unpaid") if isinstance(market, dict) else None
    if isinstance(left, list) and left:  # arceusd.market.unpaid: this device left jobs that did not pay it
        lines.append(f"  unpaid {len(left)} job(s) left")
        lines += [f"    {str(x.get('job_id', ''))[:12]}  {x.get('reason', '')}" for x in left if isinstance(x, dict)]
    return lines


@cli.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--members",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Start once this many devices (this one included) have joined (at least [needs] min_members).",
)
@click.option("--watch", is_flag=True, help="Follow the job's progress until it ends.")
@click.option("--quote", is_flag=True, help="Print the estimate (time, cost, the cloud's cost) and announce nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --quote: the estimate as JSON.")
@pass_ctx
def submit(obj: Context, spec: Path, members: int, watch: bool, quote: bool, as_json: bool) -> None:
    """Submit the job SPEC (TOML or JSON): this device becomes its owner and announces it."""
    asked_at = process_began()  # the job's start as its quote times it: from the command, its imports included

    try:
        parsed = load_spec(spec)  # the same checks the daemon makes, with the same messages, before anything is sent
    except JobSpecError as exc:
        raise click.ClickException(str(exc)) from None
    members = max(members, parsed.needs.min_members)  # [needs] min_members, when the spec states one
    if as_json and not quote:
        raise click.UsageError("--json goes with --quote (submit prints its job id; `arceusd status JOB --json`)")
    if quote:
        return print_quote(obj, parsed, members, as_json)
    obj.note_measuring()  # the daemon measures this device before it takes the job (its offer, what it lends)
    result = obj.call(
        "submit", {"spec_path": str(spec.absolute()), "min_members": members, "asked_at": asked_at}, timeout=120.0
    )
    click.echo(f"submitted job {result['job_id']} ({result['name']}), spec hash {result['spec_hash'][:16]}")
    click.echo(f"  waiting for {members} member(s); follow it with `arceusd status {result['job_id'][:8]} --watch`")
    if watch:
        ctx = click.get_current_context()
        ctx.invoke(status, job=result["job_id"], as_json=False, watch=True, interval=1.0)


@cli.command()
@click.argument("job")
@pass_ctx
def join(obj: Context, job: str) -> None:
    """Offer this device to JOB (an id or a unique prefix); the job's owner decides whether to admit it."""
    obj.note_measuring()  # the join carries this device's measured offer
    result = obj.call("join", {"job_id": job}, timeout=120.0)
    if result["accepted"]:
        click.echo(f"joined job {result['job_id']}")
    else:
        raise click.ClickException(f"the owner refused: {result['reason']}")


@cli.command()
@click.argument("job")
@pass_ctx
def leave(obj: Context, job: str) -> None:
    """Take this device out of JOB now: the leader repartitions over the others at once (no failure detection
    wait) and resumes from the last checkpoint."""
    result = obj.call("leave", {"job_id": job}, timeout=60.0)
    click.echo(f"left job {result['job_id']}" + (f" ({result['reason']})" if result.get("reason") else ""))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_ctx
def jobs(obj: Context, as_json: bool) -> None:
    """List the jobs this daemon knows (owned, joined or announced)."""
    _echo_list(obj.call("jobs"), as_json, job_line, "no jobs known (submit one with `arceusd submit job.toml`)")


@cli.command()
@click.argument("job")
@pass_ctx
def cancel(obj: Context, job: str) -> None:
    """Stop JOB everywhere (owner only)."""
    result = obj.call("cancel", {"job_id": job}, timeout=60.0)
    click.echo(f"job {result['job_id']} is {result['state']}")


def _peer_line(peer: dict[str, Any]) -> str:
    rtt = peer.get("rtt_ms")
    rtt_text = f"{rtt:.1f} ms" if isinstance(rtt, int | float) else "-"
    heard = peer.get("last_heard_s")
    heard_text = f"{heard:.1f}s ago" if isinstance(heard, int | float) else "never"
    return (
        f"{peer.get('peer_id', '?')[:12]}  {peer.get('state', '?'):<7} inc {peer.get('incarnation', '?'):<4} "
        f"rtt {rtt_text:<9} heard {heard_text:<10} {peer.get('address', '')}  {peer.get('device', '')}"
    )


@cli.command("id")
@pass_ctx
def show_id(obj: Context) -> None:
    """Print this device's peer id (creating the identity key on first use)."""
    try:
        identity = load_or_create_identity(obj.state_dir)
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(identity.peer_id)


@cli.command()
@click.option("-n", "--lines", type=int, default=50, show_default=True, help="How many lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@pass_ctx
def logs(obj: Context, lines: int, follow: bool) -> None:
    """Show the tail of the daemon's log file."""
    path = obj.paths.log_file
    if not path.exists():
        raise click.ClickException(
            f"no log file at {path} (a --foreground daemon logs to its terminal; the service and --detach log here)"
        )
    for line in tail(path, lines):  # log lines quote remote strings (job names, reasons): escaped
        click.echo(safe_text(line, None))
    if follow:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            fh.seek(0, os.SEEK_END)
            try:
                while True:
                    line = fh.readline()
                    if line:
                        click.echo(safe_text(line.rstrip("\n"), None))
                    else:
                        time.sleep(0.25)
            except KeyboardInterrupt:
                return


@cli.command()
@click.option(
    "--size",
    type=click.IntRange(1, 16),
    default=2,
    show_default=True,
    help="How many local daemons (2 on a 2-core machine: each has a core; more only add overhead).",
)
@click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the swarm keeps its state (default: a new temporary directory).",
)
@click.option(
    "--steps",
    type=click.IntRange(10, 100_000),
    default=1000,
    show_default=True,
    help="Training steps of the demo job (about 2k tokens each).",
)
def demo(size: int, root: Path | None, steps: int) -> None:
    """A local swarm of daemons on loopback trains a character GPT on Tiny Shakespeare."""
    run_demo(size, root, steps)


def main() -> None:
    """The ``arceusd`` entry point: any failure is one line on stderr and a non-zero exit, a traceback only at
    ``--log-level debug`` (:mod:`arceusd.base.failures`)."""
    debug = debug_requested(sys.argv[1:])
    if not debug:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # grpc's C core would print a taken port's bind error too
    try:
        code = cli.main(prog_name="arceusd", standalone_mode=False)
    except click.UsageError as exc:  # a mistyped command or option: what was wrong, and where the help is
        where = exc.ctx.command_path if exc.ctx is not None else "arceusd"
        click.echo(f"arceusd: {_flat(exc.format_message()).rstrip('.')}; see `{where} --help`", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # one line; a job spec's problems are listed one per line under it
        click.echo(f"arceusd: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("arceusd: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # everything else: one line, the traceback only at --log-level debug
        if debug:
            raise
        message, code = one_line(exc)
        click.echo(f"arceusd: {message}", err=True)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else 0)


def _flat(text: str) -> str:
    return " ".join(text.split())


_register_market(cli)
_register_dashboard(cli)
