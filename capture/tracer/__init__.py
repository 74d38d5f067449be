"""The bpftrace tracer of ``stallscope capture`` (standard library only).

- :mod:`.program`: the program, ``bpf/nccl.bt`` rendered for this host (probe tables, kernel
  features, hot-path modes), and the stop/dump triggers;
- :mod:`.spool`: bpftrace's output copied into raw segment files while the capture runs;
- :mod:`.events`: ``bpf/events.jsonl`` built from the spooled lines at the end;
- :mod:`.libs`: the watcher's tracer with no blind window (libraries ahead of time, at their
  mapping, restarts with overlap, the bound);
- :mod:`.libscan`: the host's libnccl files found before any job maps them.

The collector that runs it is ``capture.collectors.tracer.Tracer``. This package imports
none of its modules.
"""
