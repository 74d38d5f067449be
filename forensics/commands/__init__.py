"""Subcommands. Each module defines HELP, add_arguments(parser) and run(args, env),
and is registered here by name; adding a command is one module and one line. Optional:
POSITIONAL_REST (the list that positionals after an option join) and EXIT_AT_ONCE (nothing
to tear down once run returns: the program ends without the interpreter's teardown, see
``forensics.cli.console``).

Command modules import only the standard library at module level (heavy imports
go inside ``run``), so ``stallscope capture`` works on a node without numpy."""
from . import analyze, capture, query, tcp

COMMANDS = {
    "capture": capture,
    "tcp": tcp,
    "query": query,
    "analyze": analyze,
}
