"""Subcommands. Each module defines HELP, add_arguments(parser) and run(args, env),
and is registered here by name; adding a command is one module and one line.

Command modules import only the standard library at module level (heavy imports
go inside ``run``), so ``stallscope capture`` works on a node without numpy."""
from . import analyze, capture, query, tcp

COMMANDS = {
    "capture": capture,
    "tcp": tcp,
    "query": query,
    "analyze": analyze,
}
