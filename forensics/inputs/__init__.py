"""What ``stallscope analyze`` reads, before any table is built (standard library and numpy only).

- :mod:`.intake`: sorts what the user gave into bundles and one set of loose evidence;
- :mod:`.layout`: a bundle's name and layout on disk (the command line sorts with it early);
- :mod:`.archive`: archives from untrusted hands, unpacked safely (bundles strict, loose lenient);
- :mod:`.bundle`: one host's capture bundle opened: typed manifest, files, clock conversion;
- :mod:`.loose`: loose evidence (logs, nccl-tests, ``ibstat``, captures) read as a bundle.

This package imports none of its modules, so importing one stays as cheap as the module itself.
"""
