"""The ``stallscope`` command line: a thin layer over the library.

Each subcommand lives in ``forensics.commands.<name>`` and registers itself in
``COMMANDS``; this module only builds the parser, dispatches, and turns the
library's errors into one line on stderr and an exit code (``ExitCode``).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import TextIO

from . import __version__
from .commands import COMMANDS
from .errors import ExitCode, StallscopeError


@dataclass
class Env:
    """What a command may touch besides its arguments; tests inject their own."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    debug: bool = field(default_factory=lambda: bool(os.environ.get("STALLSCOPE_DEBUG")))

    def warn(self, message: str) -> None:
        print(f"stallscope: warning: {message}", file=self.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit code 2 (argparse's default is 2 as well)
        self.print_usage(sys.stderr)
        raise SystemExit(f"stallscope: error: {message}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="stallscope",
                     description="Forensics for stalled and hung multi-node NCCL training jobs.")
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.HELP, description=command.HELP)
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def main(argv: list[str] | None = None, env: Env | None = None) -> int:
    env = env or Env()
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        # options may sit between positionals (`query BUNDLE --db X "SQL"`): argparse leaves the
        # positionals after such an option over; they belong to the command's open-ended list
        rest = getattr(getattr(args, "_command", None), "POSITIONAL_REST", None)
        if extra and rest and not any(e.startswith("-") and e != "-" for e in extra):
            setattr(args, rest, list(getattr(args, rest)) + extra)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=env.stderr)
            return ExitCode.BAD_INPUT
        return int(exc.code or 0)
    try:
        return int(args._command.run(args, env))
    except StallscopeError as exc:
        print(f"stallscope: error: {exc}", file=env.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=env.stderr)
        return 130
    except BrokenPipeError:
        return ExitCode.OK
    except Exception as exc:  # a bug: one line for the user, the trace on request
        if env.debug:
            traceback.print_exc(file=env.stderr)
        print(f"stallscope: internal error: {type(exc).__name__}: {exc} "
              "(set STALLSCOPE_DEBUG=1 for the traceback)", file=env.stderr)
        return 70
