"""Loose evidence read as a bundle: the job's logs, nccl-tests output, ``ibstat``, captures.

:class:`LooseBundle` is a :class:`forensics.inputs.bundle.Bundle` with no layout: no manifest, no
tracer, no ``sys/`` snapshots; its files (:class:`forensics.inputs.intake.LooseSet`) are typed by
content alone (:func:`forensics.model.artifacts.read_artifacts`), packet captures among them by
their magic. The per-host stage reads it like any bundle, so loose evidence gets the same
tables, findings, outputs and ``--jobs`` as bundles do. Its ``host`` is a label, not a host: the
rows its files give carry the hosts their own lines name (:mod:`forensics.model.logs`).

What a loose set cannot hold is said once, in :meth:`LooseBundle.summary`, for the report's
capture section: no packets unless a capture was given, no tracer, no process facts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ..errors import InputError
from ..pcap.reader import FORMATS
from .bundle import Bundle, EventLog, Manifest
from .intake import LooseSet

# what each kind of evidence a bundle has, and loose evidence lacks, would have told
ABSENT = {
    "packets": "no retransmission, reset or slow-link verdict from the wire",
    "tracer": "no NCCL call timeline: collectives and hangs are known only from the logs' own lines",
    "process facts": "no environment, sockets or stacks of the job's processes",
}


def is_pcap(path: str | Path) -> bool:
    """Whether the file starts with a magic number the capture reader knows (pcap, pcapng)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, "little") in FORMATS


class LooseBundle(Bundle):
    """A :class:`LooseSet` seen through the :class:`Bundle` interface (module docstring)."""

    def __init__(self, loose: LooseSet):
        manifest = Manifest(schema_version=None, tool_version=None, host=loose.label, boot_id=None, kernel=None,
                            started_ns=None, ended_ns=None, clock_samples=[], collectors={}, processes=[],
                            netns=[], files=[], options={}, raw={"kind": "loose"})
        super().__init__(Path(loose.label), Path(loose.label), manifest, [], None)
        self.loose = loose
        self._pcaps = [(f.rel, Path(f.path)) for f in loose.files if is_pcap(f.path)]
        self.manifest.options["pcap"] = bool(self._pcaps)
        # filled by the per-host stage: file -> the parsers that read it; file -> why not read
        self.read_by: dict[str, list[str]] = {}
        self.not_read: dict[str, str] = {n.rel: n.reason for n in loose.not_read}

    @classmethod
    def open(cls, loose: LooseSet) -> "LooseBundle":   # type: ignore[override]
        return cls(loose)

    # ---- no bundle layout
    def files(self, pattern: str = "**/*") -> Iterator[tuple[str, Path]]:
        return iter(())

    def path(self, rel: str) -> Path | None:
        return None

    def pcaps(self) -> list[tuple[str, Path]]:
        return list(self._pcaps)

    def read_bpf_events(self) -> EventLog:
        return EventLog()

    def loose_files(self) -> list[tuple[str, Path]]:
        """(label, path) of the files to type by content (captures excepted)."""
        caps = {rel for rel, _ in self._pcaps}
        return [(f.rel, Path(f.path)) for f in self.loose.files if f.rel not in caps]

    def summary(self) -> dict:
        """The capture section's entry for this evidence: files read (and by what), files not
        read (and why), the kinds of evidence absent and what each limits."""
        absent = {k: v for k, v in ABSENT.items() if not (k == "packets" and self._pcaps)}
        return {
            "kind": "loose",
            "files_read": [{"path": rel, "parsers": ps} for rel, ps in sorted(self.read_by.items())]
            + [{"path": rel, "parsers": ["pcap"]} for rel, _ in self._pcaps],
            "not_read": [{"path": rel, "reason": why} for rel, why in sorted(self.not_read.items())],
            "absent": [{"evidence": k, "limits": v} for k, v in absent.items()],
        }


def merge(parts: list) -> list:
    """The per-host parts with the shares of one loose set (``--jobs`` reads it split) put back
    into one part, where the first share was; bundles' parts unchanged."""
    import pandas as pd
    shares = [p for p in parts if isinstance(p.bundle, LooseBundle)]
    if len(shares) < 2:
        return parts
    first = shares[0]
    b = first.bundle
    for s in shares[1:]:
        b.read_by.update(s.bundle.read_by)
        b.not_read.update(s.bundle.not_read)
        b.problems.extend(s.bundle.problems)
        b._pcaps.extend(s.bundle._pcaps)
    b.loose = LooseSet(b.loose.label, tuple(f for s in shares for f in s.bundle.loose.files),
                       tuple(n for s in shares for n in s.bundle.loose.not_read), given=b.loose.given)

    # rows in the order one process reads them: file by file in the order the files were found
    order = {f.rel: i for i, f in enumerate(sorted(b.loose.files, key=lambda f: f.order))}

    def cat(frames):
        frames = [f for f in frames if f is not None and len(f.columns)]
        if not frames:
            return None
        df = pd.concat(frames, ignore_index=True)
        if "artifact" in df.columns and len(df):
            pos = df["artifact"].astype("string").fillna("").str.split(",").str[0].map(order).fillna(len(order))
            df = df.iloc[pos.to_numpy().argsort(kind="stable")].reset_index(drop=True)
        return df
    first.comms = cat([s.comms for s in shares])
    first.tables = {k: cat([s.tables.get(k) for s in shares]) if any(
        s.tables.get(k) is not None and len(s.tables[k]) for s in shares) else first.tables[k]
        for k in first.tables}
    cfg = first.tables.get("nccl_config")
    if cfg is not None and len(cfg):      # config_tables' own order, over every share's processes
        first.tables["nccl_config"] = cfg.sort_values(["host", "rank", "pid"], na_position="last", kind="stable") \
            .reset_index(drop=True)
    for attr in ("packets", "events", "flows", "timing"):
        setattr(first.pcap, attr, [x for s in shares for x in getattr(s.pcap, attr)])
    prints = [s.pcap.fingerprints for s in shares if s.pcap.fingerprints is not None]
    if prints:
        first.pcap.fingerprints = pd.concat(prints, ignore_index=True)
        first.pcap.address_pairs = frozenset().union(*(s.pcap.address_pairs for s in shares))
    first.pcap.packets_seen = sum(s.pcap.packets_seen for s in shares)
    return [p for p in parts if p is first or not isinstance(p.bundle, LooseBundle)]


def nothing_read(parts: list) -> None:
    """Raise InputError (one line) when the inputs held no bundle and no loose file any parser
    read: there is nothing to analyze, and the user should hear why at once."""
    if any(not isinstance(p.bundle, LooseBundle) for p in parts):
        return
    loose = [p.bundle for p in parts]
    if any(b.read_by or b.pcaps() for b in loose):
        return
    why = [f"{rel} ({reason})" for b in loose for rel, reason in sorted(b.not_read.items())]
    shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
    raise InputError("nothing stallscope can read: no bundle, and no file holds NCCL, PyTorch, nccl-tests or "
                     "InfiniBand output" + (f": {shown}" if shown else ""))


__all__ = ["LooseBundle", "is_pcap", "merge", "nothing_read", "ABSENT"]
