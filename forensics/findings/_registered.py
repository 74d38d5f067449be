"""The detector modules; importing this module registers every detector.
Adding a kind of finding: one module with ``@detector("kind")`` functions, one line here."""
# noqa: F401 for every import: imported for their registration
