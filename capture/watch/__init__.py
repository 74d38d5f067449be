"""``stallscope capture --watch``: the black box (standard library only).

- :mod:`.watcher`: the watcher (:class:`~.watcher.Watcher`, :func:`~.watcher.run_watch`): the
  capture orchestrator with the ring policy and the ring collectors, and its trigger loop;
- :mod:`.monitors`: what it watches for a hang (the tracer's call state, the job's logs, the
  tracer-free socket signs);
- :mod:`.init_hang`: its init-hang trigger (ranks stuck in a communicator's init);
- :mod:`.triggers`: what fired (:class:`~.triggers.Trigger`), the registry of a host's watchers,
  ``stallscope capture --trigger``;
- :mod:`.incident`: an incident's bundle cut from the rings, in two stages.

This package imports none of its modules.
"""
