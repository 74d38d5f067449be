"""``stallscope capture``: one host's bundle (or ``--watch``: one per incident); a thin layer
over ``capture.cli.execute``.

The options are defined once, in ``capture/cli.py``, for this command and for
``python3 -m capture`` alike.
"""
from __future__ import annotations

import argparse

from capture import cli as capture_cli
from capture.options import CaptureFailed, CaptureUsageError

from ..errors import ExitCode, StallscopeError

HELP = capture_cli.HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    capture_cli.add_arguments(p)
    p.epilog = capture_cli.EPILOG


def run(args: argparse.Namespace, env) -> int:
    try:
        paths, code = capture_cli.execute(args, env.stderr)
    except CaptureUsageError as e:
        raise StallscopeError(str(e)) from None
    except CaptureFailed as e:   # no bundle (a full disk): one line, exit code 3, the data kept
        err = StallscopeError(str(e))
        err.exit_code = ExitCode.CAPTURE_PARTIAL
        raise err from None
    for path in paths:
        if path is not None:
            print(path, file=env.stdout)
    return code
