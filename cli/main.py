"""Entry point: the click group, shared options and the exit-code contract (0 ok, 1 failure, 2 usage)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from autotune_cache import __version__
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.layout import sglang_cache_root

PROG = "fi-autotune"


def resolve_root(cache_dir: str | None) -> Path:
    """``--cache-dir`` or the engine's own root; a path that is a file is a usage error."""
    root = Path(cache_dir) if cache_dir is not None else sglang_cache_root()
    if root.exists() and not root.is_dir():
        raise UsageError(f"cache dir {str(root)!r} exists and is not a directory")
    return root


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=True, dir_okay=True),
    default=None,
    help="Engine cache root holding flashinfer/autotune (default: $SGLANG_CACHE_DIR or ~/.cache/sglang).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
quiet_option = click.option("-q", "--quiet", is_flag=True, help="Print keys only.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name=PROG)
def cli() -> None:
    """Ahead-of-time FlashInfer autotune caches where serving engines look for them."""


def _register() -> None:
    from . import keycmd, plancmd, transfer, tree, warmcmd  # noqa: F401  (commands attach themselves to ``cli``)


def main(argv: list[str] | None = None) -> int:
    _register()
    try:
        # Without standalone mode click returns the code of a ``click.exceptions.Exit``.
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo(f"{PROG}: aborted", err=True)
        return 1
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        # Click's own usage errors print several lines; ours promise one.
        click.echo(f"{PROG}: error: {e.format_message()}", err=True)
        return 2 if isinstance(e, click.UsageError) else e.exit_code
    except UsageError as e:
        click.echo(f"{PROG}: error: {e}", err=True)
        return 2
    except FiAutotuneError as e:
        click.echo(f"{PROG}: error: {e}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    return rv if isinstance(rv, int) else 0


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
