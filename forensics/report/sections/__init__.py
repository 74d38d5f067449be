"""The report's sections, each computed once for every renderer (HTML, Markdown, Perfetto):
one module a concern, gathered for the renderers by :mod:`forensics.report.data`.

- :mod:`.common`: what they share (tables a bundle may lack, times, global ranks, memos);
- :mod:`.verdict`: the first screen under the headline;
- :mod:`.progress`: how far each rank got, each communicator's hang point;
- :mod:`.timeline`: the collective calls as intervals in lanes;
- :mod:`.ranks`: the per-rank table, its totals, which ranks to show first;
- :mod:`.network`: TCP event classes, links, flows, InfiniBand, the rendezvous store;
- :mod:`.processes`: threads' off-CPU time, stacks, Flight Recorder's last entries;
- :mod:`.captures`: the bundles, their windows, clock skew;
- :mod:`.problems`: the capture's gaps and the problems met, grouped over hosts.

This package imports none of its modules: each is imported by name.
"""
