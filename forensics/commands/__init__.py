"""Subcommands. Each module defines HELP, add_arguments(parser) and run(args, env),
and is registered here by name; adding a command is one module and one line."""
from . import tcp

COMMANDS = {
    "tcp": tcp,
}
