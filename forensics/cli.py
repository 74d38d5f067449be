"""The ``stallscope`` command line: a thin layer over the library.

Each subcommand lives in ``forensics.commands.<name>`` and registers itself in
``COMMANDS``; this module only builds the parser, dispatches, and turns the
library's errors into one line on stderr and an exit code (``ExitCode``).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
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
    """Run the command line ``argv``; its exit code."""
    return _dispatch(argv, env)[0]


def console() -> None:
    """The ``stallscope`` program (and ``python -m forensics``): :func:`main`, then the process
    ends. After a command whose module sets ``EXIT_AT_ONCE`` (its outputs written and closed,
    its worker processes reaped: ``analyze``, ``query``), and with no other thread left (a Dask
    client's, say), the interpreter's teardown is skipped once the standard streams are
    flushed: freeing an analysis object by object costs 0.1 s at 8 hosts and 0.5 s at 64,
    for nothing (mypy ends the same way)."""
    code, command = _dispatch(None, None)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):     # a closed pipe: nothing more can be said there
            pass
    if getattr(command, "EXIT_AT_ONCE", False) and threading.active_count() == 1:
        os._exit(code)
    sys.exit(code)


WAYS_IN = """stallscope: forensics for stalled and hung multi-node NCCL training jobs.

Two ways in:
  during the incident, on each host (as root):
      stallscope capture -o /var/tmp/stallscope --duration 120s
      (one bundle per host; Ctrl-C ends it early)
  afterwards, anywhere, on the bundles or on the logs you already have:
      stallscope analyze stallscope-*.tar.gz
      stallscope analyze slurm-1234.out nccl-debug/ torchrun-logs.tar.gz
      (writes report.html; pasted, wrapped or quoted text is read as it is)

Then: stallscope query BUNDLES "SQL" (tables nccl_events, tcp_events, ...); stallscope tcp PCAP.
stallscope COMMAND --help for each command's options; stallscope --help for the list."""


def _dispatch(argv: list[str] | None, env: Env | None) -> tuple[int, object]:
    """(the exit code, the command module that ran; None when the arguments were refused).
    No arguments at all: the two ways in (:data:`WAYS_IN`), exit code 2."""
    env = env or Env()
    if not (sys.argv[1:] if argv is None else argv):
        print(WAYS_IN, file=env.stderr)
        return ExitCode.BAD_INPUT, None
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
            return ExitCode.BAD_INPUT, None
        return int(exc.code or 0), None
    command = args._command
    try:
        return int(command.run(args, env)), command
    except StallscopeError as exc:
        print(f"stallscope: error: {exc}", file=env.stderr)
        return int(exc.exit_code), command
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=env.stderr)
        return 130, command
    except BrokenPipeError:
        return ExitCode.OK, command
    except Exception as exc:  # a bug: one line for the user, the trace on request
        if env.debug:
            traceback.print_exc(file=env.stderr)
        print(f"stallscope: internal error: {type(exc).__name__}: {exc} "
              "(set STALLSCOPE_DEBUG=1 for the traceback)", file=env.stderr)
        return 70, command
