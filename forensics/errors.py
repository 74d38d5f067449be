"""Errors and exit codes shared by the library and the command line."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FOUND_ERROR = 1       # analysis ran and found a problem of severity error
    BAD_INPUT = 2         # bad usage or unreadable input
    CAPTURE_PARTIAL = 3   # capture partially failed


class StallscopeError(Exception):
    """An error the user can act on; the CLI prints it as one line."""

    exit_code = ExitCode.BAD_INPUT


class InputError(StallscopeError):
    """Input that cannot be read at all."""


class CaptureFormatError(InputError):
    """A capture file whose structure is not pcap/pcapng or is corrupt."""
