"""The detector modules; importing this module registers every detector.
Adding a kind of finding: one module with ``@detector("name", kinds=(...))`` functions, one line here.
Each module owns the kinds it is named after (``base.owners()``); the evidence modules its
detectors read (``late_state``, ``timeouts``, ``socket_errors``, ``warns``, ...) register no
detector. Those that give a source of the precedence table register its function
(``precedence.finds``), imported at the end for it."""
# noqa: F401 for every import: imported for their registration
from . import network  # noqa: F401,E402  (network_loss, slow_link)
from . import connection_reset  # noqa: F401,E402  (connection_reset)
from . import straggler  # noqa: F401,E402  (straggler)
from . import config  # noqa: F401,E402  (misconfiguration, transport)
from . import nccl_tests  # noqa: F401,E402  (nccl_tests_bandwidth)
from . import hang  # noqa: F401,E402  (hang_mismatch, hang_host, hang_stuck)
from . import ib  # noqa: F401,E402  (ib_errors)
from . import gpu  # noqa: F401,E402  (gpu_error)
from . import nccl_error  # noqa: F401,E402  (nccl_error)
from . import process_exit  # noqa: F401,E402  (process_exit)
from . import init  # noqa: F401,E402  (init_failure)
from . import link_flap  # noqa: F401,E402  (link_flap)
from . import init_hang  # noqa: F401,E402  (init_hang)
from . import stall  # noqa: F401,E402  (stall_resolved)
# evidence modules, imported for their precedence sources (precedence.finds); hang and
# connection_reset above register the witnesses (precedence.sees)
from . import late_state  # noqa: F401,E402  (state at capture: hangs, resets)
from . import reports  # noqa: F401,E402  (NCCL RAS report, Flight Recorder report and dumps)
from . import socket_errors  # noqa: F401,E402  (WARN lines: resets by address, socket errors)
from . import timeouts  # noqa: F401,E402  (watchdog lines: hangs)
