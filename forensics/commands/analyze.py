"""``stallscope analyze INPUT ...``: findings and the incident report; thin over
:func:`forensics.analysis.analyze` and the renderers of :mod:`forensics.report`.

Inputs are bundles, or whatever else the incident left (job logs, folders of them, archives,
nccl-tests output, ``ibstat``), mixed freely (:mod:`forensics.inputs.intake`).

Every output is checked before the (possibly long) analysis starts, so an existing
file is refused at once; files are written through :func:`forensics.output.open_output`
(never overwritten without ``--force``, never left half written). Progress goes to
stderr; stdout gets the verdict and the paths written. Exit code 1 when a finding of
severity error exists, 0 otherwise, 2 on bad input.
"""
from __future__ import annotations

import argparse
import os
import time

from ..errors import ExitCode, InputError
from ..output import check_output

POSITIONAL_REST = "bundles"   # positionals after an option join this list (see cli.main)
EXIT_AT_ONCE = True          # nothing to tear down after run (see cli.console)
HELP = ("analyze bundles and/or the job's own logs, nccl-tests output, ibstat (files, folders, archives): "
        "ranked findings and a self-contained HTML report")
DEFAULT_REPORT = "stallscope-report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundles", nargs="+", metavar="INPUT",
                   help="bundles (tar.gz or unpacked folder, one per host), and/or loose evidence: job logs "
                        "(slurm-*.out, torchrun logs, NCCL_DEBUG_FILE), nccl-tests output, ibstat / ibv_devinfo, "
                        "folders of them (walked), archives of them (tar, tar.gz, zip, gz)")
    p.add_argument("-o", "--output", metavar="REPORT.html", default=DEFAULT_REPORT,
                   help=f"HTML report (default: ./{DEFAULT_REPORT})")
    p.add_argument("--json", metavar="FILE", help="findings as JSON (DESIGN.md contract; '-' for stdout)")
    p.add_argument("--markdown", metavar="FILE", help="ticket-ready Markdown summary ('-' for stdout)")
    p.add_argument("--perfetto", metavar="FILE", help="Chrome trace event JSON for ui.perfetto.dev")
    p.add_argument("--db", metavar="FILE", help="keep the event tables and findings as a DuckDB file")
    p.add_argument("--slow-ms", type=float, default=50.0, metavar="MS",
                   help="a collective slower than this is slow (default: 50)")
    p.add_argument("-j", "--jobs", type=int, metavar="N",
                   help="read the bundles on N processes, this one and N-1 workers (default: this "
                        "machine's cores, or 1 for a few small bundles)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="read the bundles on the Dask cluster at ADDRESS (tcp://host:8786); the bundle "
                        "paths must be readable by every worker")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def _outputs(args) -> dict[str, str]:
    outs = {"html": args.output, "json": args.json, "markdown": args.markdown, "perfetto": args.perfetto}
    outs = {k: v for k, v in outs.items() if v}
    real = [os.path.abspath(v) for v in outs.values() if v != "-"] + ([os.path.abspath(args.db)] if args.db else [])
    if len(set(real)) < len(real):
        raise InputError("two outputs name the same file")
    if sum(v == "-" for v in outs.values()) > 1:
        raise InputError("only one output can be '-' (stdout)")
    for path in real:
        check_output(path, args.force)
    if args.slow_ms <= 0:
        raise InputError("--slow-ms must be positive")
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    if args.jobs is not None and args.dask:
        raise InputError("--jobs and --dask exclude each other (the Dask cluster has its own workers)")
    return outs


def run(args: argparse.Namespace, env) -> int:
    outs = _outputs(args)
    from ..execution import default_jobs, memory
    from ..execution.reader_pool import ReaderPool
    from ..inputs.intake import gather
    memory.keep_freed_memory()    # before the workers fork: they inherit it
    # what was given sorted out (standard library only: archives of logs unpacked, folders walked)
    mine = [v for v in outs.values() if v != "-"] + ([args.db] if args.db else [])
    with gather(args.bundles, exclude=mine) as intake:
        jobs = None if args.dask else args.jobs or default_jobs(intake.sources(default_jobs()))
        sources = intake.sources(jobs or 1)
        jobs = None if jobs is None else min(jobs, len(sources))
        # what the analysis keeps until the report is written is settled out of the garbage
        # collector's reach as it is made (forensics.execution.memory)
        with memory.steady():
            # the worker processes start on the first bundles now, while this process imports the
            # analyzer; then it reads beside them
            readers = ReaderPool(sources, jobs) if jobs is not None and jobs > 1 else None
            try:
                return _run(args, env, outs, jobs, readers, intake)
            finally:
                if readers is not None:
                    readers.close()


def _execution(args: argparse.Namespace, outs: dict[str, str], jobs: int | None, readers):
    """The execution choice of the command line's flags: ``--dask ADDRESS`` or ``jobs`` local
    readers (``readers``: the pool started on them already); the report's templates compiled
    while the workers read, and its model-only tables made beside the detectors."""
    from ..execution import Execution
    from ..report import model_steps, prepare
    hooks = {"meanwhile": lambda: prepare(outs),
             "model_steps": tuple(model_steps()) if {"html", "markdown", "perfetto"} & set(outs) else ()}
    if args.dask:
        return Execution.on_dask(args.dask, **hooks)
    return Execution(jobs=jobs or 1, readers=readers, **hooks)


def _run(args: argparse.Namespace, env, outs: dict[str, str], jobs: int | None, readers, intake) -> int:
    from ..analysis import analyze
    from ..findings import Options
    from ..output import open_output, staged_path
    from ..report import WRITERS

    start = time.monotonic()

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"stallscope: [{time.monotonic() - start:5.1f}s] {msg}", file=env.stderr, flush=True)

    # the database is built next to its final name and moved there at the end: an existing
    # one (--force) is replaced only by a complete new one
    with staged_path(args.db, force=args.force, suffix=".duckdb") as db:
        analysis = analyze(intake, options=Options(slow_ms=args.slow_ms), db=db, progress=say,
                           execution=_execution(args, outs, jobs, readers))
        try:
            # problems that differ only by host: one line each (the report's capture section has them all)
            from ..report.data import grouped_problems
            said = grouped_problems(analysis.problems, analysis.model.hosts)
            for p in said[:20]:
                env.warn(p)
            if len(said) > 20:
                env.warn(f"... and {len(said) - 20} more problems (in the report's capture section)")
            for kind, path in outs.items():
                say(f"rendering {kind}: {path}")
                with open_output(path, force=args.force) as fh:
                    WRITERS[kind](analysis, fh)
            verdict = analysis.verdict()
            error = any(f.severity == "error" for f in analysis.findings)
        finally:
            analysis.close()
    say("done")
    out = env.stderr if "-" in outs.values() else env.stdout
    print(f"verdict: {verdict}", file=out)
    for kind, path in outs.items():
        if path != "-":
            print(f"{kind}: {path}", file=out)
    if args.db:
        print(f"db: {args.db}", file=out)
    return ExitCode.FOUND_ERROR if error else ExitCode.OK
