"""`python -m cuzk_engine`: one argparse program whose subcommands live in separate modules.

To add commands, append a module to COMMAND_MODULES. Each module exposes
`register(subparsers)` for top-level commands and may expose `register_bench(bench)` to add
subcommands under `bench`. A command sets `func(args) -> int` as its parser default, and
`skip_teardown=True` when, run as its own process, nothing it leaves needs cleaning up: the
process then ends without the interpreter's teardown (freeing every object and module took
~0.1 s of a 1 s `prove`).
Errors the engine reports (CuzkError) print one line on stderr and exit 2, without traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from cuzk_engine.errors import CuzkError
from cuzk_engine.paths import default_param_cache

COMMAND_MODULES = [
    "cuzk_engine.cli.prover",
    "cuzk_engine.cli.engine",
]


def add_param_cache_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--param-cache", type=Path, default=None,
                        help="parameter cache directory (default: $CUZK_PARAM_CACHE or "
                             "~/.cache/cuzk_engine/params)")


def param_cache(args: argparse.Namespace) -> Path:
    return args.param_cache if args.param_cache is not None else default_param_cache()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cuzk_engine",
        description="Groth16 proving engine over BLS12-381 (Filecoin-shaped proof kinds).")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = subparsers.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
        if hasattr(module, "register_bench"):
            module.register_bench(bench_sub)
    return parser


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Runs one command. `own_process`: the caller is `python -m cuzk_engine`, which ends when
    the command does; a command that allows it then ends the process at once."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
        if own_process and getattr(args, "skip_teardown", False):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        return rc
    except CuzkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
