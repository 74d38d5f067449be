"""``stallscope capture``: one host's bundle; a thin layer over ``capture.run_capture``.

The options are defined once, in ``capture/cli.py``, for this command and for
``python3 -m capture`` alike.
"""
from __future__ import annotations

import argparse

from capture import cli as capture_cli

from ..errors import ExitCode, StallscopeError

HELP = capture_cli.HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    capture_cli.add_arguments(p)
    p.epilog = capture_cli.EPILOG


def run(args: argparse.Namespace, env) -> int:
    from capture import CaptureFailed, CaptureUsageError, run_capture
    try:
        if args.recover:
            for path in capture_cli.recover(args, env.stderr):
                print(path, file=env.stdout)
            return 0
        capture_cli.ignore_late_signals()
        result = run_capture(capture_cli.options_from_args(args), stderr=env.stderr)
    except CaptureUsageError as e:
        raise StallscopeError(str(e)) from None
    except CaptureFailed as e:   # no bundle (a full disk): one line, exit code 3, the data kept
        err = StallscopeError(str(e))
        err.exit_code = ExitCode.CAPTURE_PARTIAL
        raise err from None
    print(result.path, file=env.stdout)
    return result.exit_code
