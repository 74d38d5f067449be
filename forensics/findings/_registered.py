"""The detector modules; importing this module registers every detector.
Adding a kind of finding: one module with ``@detector("kind")`` functions, one line here."""
# noqa: F401 for every import: imported for their registration
from . import network  # noqa: F401,E402
from . import straggler  # noqa: F401,E402
from . import config  # noqa: F401,E402  (misconfiguration, transport)
from . import nccl_tests  # noqa: F401,E402  (nccl_tests_bandwidth)
from . import hang  # noqa: F401,E402
from . import ib  # noqa: F401,E402
from . import gpu  # noqa: F401,E402  (gpu_error)
from . import state  # noqa: F401,E402  (hangs from the state at capture: hang_mismatch, hang_stuck, connection_reset)
