"""Fuzzing stallscope's readers of untrusted input (issue 7).

``mutate`` makes inputs from real samples (seeded, reproducible), ``targets`` names every
reader with its seeds and the contract it must keep (a result, warnings of one line each,
or the project's own one-line error; never another exception, never a hang), ``runner``
drives a target for N inputs and saves what breaks it, ``report`` prints the counts at
the end of a pytest run. ``tests/forensics/test_fuzz_parsers.py`` is the CI-sized run;
``bench/fuzz.py --examples N`` (``make fuzz``) the longer one.
"""
