"""Entry point: the click group, its commands, and the one place errors become exit codes.

Exit codes (``autotune_cache.errors.ExitCode``): 0 ok, 1 failure, 2 usage error, 130 interrupted.
Every error is one line on stderr; ``--debug`` (or ``FI_AUTOTUNE_DEBUG=1``) adds the traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from autotune_cache import __version__
from autotune_cache.errors import ExitCode, FiAutotuneError, Interrupted, is_interrupt, os_error_message

from .output import PROG

EPILOG = "Exit codes: 0 ok, 1 failure, 2 usage error, 130 interrupted (Ctrl-C). --debug shows tracebacks."


#: Each command by name -> "module:function" (one module per command, in ``commands/``), imported
#: only when that command runs (or help lists them): ``ls`` must not pay for the planner's or the tuner's imports.
COMMANDS = {
    name: f"commands.{module}:{name.replace('-', '_')}_cmd" for name, module in (
        ("plan", "plan"), ("warm", "warm"), ("verify", "verify"), ("check", "check"), ("ls", "ls"), ("show", "show"),
        ("prune", "prune"), ("rm", "rm"), ("export", "export"), ("import", "import_"), ("push", "push"),
        ("pull", "pull"), ("convert", "convert"), ("diff", "diff"), ("env", "env"), ("key", "key"),
        ("doctor", "doctor"), ("workers", "workers"),
    )
}


class LazyGroup(click.Group):
    """A group whose commands are imported when used (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
        if command.name != cmd_name:
            raise RuntimeError(f"{target} is command {command.name!r}, listed as {cmd_name!r}")
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    invoke_without_command=True,
    epilog=EPILOG,
)
@click.version_option(__version__, prog_name=PROG)
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Ahead-of-time FlashInfer autotune caches where serving engines look for them."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def hoist_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``--debug`` anywhere before ``--`` is the group's flag, put first: errors say "run with
    --debug", and a user adds it at the end of the command they just ran."""
    end = argv.index("--") if "--" in argv else len(argv)
    if "--debug" not in argv[:end]:
        return argv, False
    return ["--debug", *(a for i, a in enumerate(argv) if i >= end or a != "--debug")], True


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    click.echo(f"{PROG}: error: {message}", err=True)
    return int(code)


class ClosedPipeSafe:
    """``sys.stdout`` for a reader that may stop reading (``fi-autotune ls | head -1``).

    The first write to a closed pipe points file descriptor 1 at /dev/null and drops the rest of
    the text, so the command finishes its work and exits with its own status (0 for a listing),
    every time: whether the pipe closed before or after the last write used to decide between
    0 and 1, and ``set -o pipefail`` steps (the GitHub Actions default) failed at random.
    Binary output (``export -o -``) is not covered: its reader stopping part-way leaves an
    archive cut short, a failure (exit 1)."""

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped
        self.closed_by_reader = False

    def _drop(self) -> None:
        self.closed_by_reader = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.wrapped.fileno())  # what is still buffered flushes there
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self.wrapped.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self.wrapped.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str):
        return getattr(self.wrapped, name)


def main(argv: list[str] | None = None, obj: object = None) -> int:
    """``obj``: click's context object for every command (a test launcher's fake machine)."""
    if not isinstance(sys.stdout, ClosedPipeSafe) and hasattr(sys.stdout, "fileno"):
        sys.stdout = ClosedPipeSafe(sys.stdout)
    argv, debug = hoist_debug(list(sys.argv[1:] if argv is None else argv))
    debug = debug or os.environ.get("FI_AUTOTUNE_DEBUG") == "1"
    try:
        # Without standalone mode click returns the code of a ``click.exceptions.Exit``.
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=obj)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort as e:
        # Click turns a Ctrl-C inside a command into Abort (from the KeyboardInterrupt), and one
        # at a confirmation prompt into Abort (from nothing): both are an interruption (130). At a
        # prompt nothing has been changed yet; mid-command every step done was committed whole.
        interrupted = e.__cause__ is not None and is_interrupt(e.__cause__)
        click.echo(f"{PROG}: " + ("interrupted" if interrupted else "aborted: nothing was changed"), err=True)
        return int(ExitCode.INTERRUPTED)
    except click.ClickException as e:
        # Click's own usage errors print several lines; ours promise one.
        code = ExitCode.USAGE if isinstance(e, click.UsageError) else e.exit_code
        return _fail(e.format_message(), code, debug)
    except Interrupted as e:  # not an error: everything complete was kept (exit 130)
        click.echo(f"{PROG}: {e}", err=True)
        return int(e.exit_code)
    except FiAutotuneError as e:
        message = str(e) + (f" ({e.hint})" if e.hint else "")
        return _fail(message, e.exit_code, debug)
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted", err=True)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError as e:  # not stdout's text (ClosedPipeSafe drops that): binary data cut short
        return _fail(os_error_message(e), ExitCode.FAILURE, debug)
    except OSError as e:
        return _fail(os_error_message(e), ExitCode.FAILURE, debug)
    except Exception as e:  # noqa: BLE001 - a bug; one line unless asked
        if is_interrupt(e):  # a Ctrl-C that Python wrapped (during a class's creation, say)
            click.echo(f"{PROG}: interrupted", err=True)
            return int(ExitCode.INTERRUPTED)
        return _fail(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
                     ExitCode.FAILURE, debug)
    return rv if isinstance(rv, int) else int(ExitCode.OK)


def console_main() -> None:
    code = main()
    if "torch" in sys.modules:
        # warm, verify and plan load torch and flashinfer; tearing them down takes about 0.3 s
        # (docs/benchmarks.md) and does nothing for us: whatever we wrote is committed and
        # fsynced, and the worker pool is already gone.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):
            pass
        os._exit(code)
    sys.exit(code)
