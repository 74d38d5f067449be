"""The classes of NCCL's WARN lines (forensics/model/nccl_errors.py) on real wordings."""
from __future__ import annotations

import pandas as pd

from forensics.model.nccl_errors import classify


def test_no_usable_interface_is_not_the_bootstrap_disagreeing():
    msgs = ["Bootstrap : no socket interface found",                                     # 2.14
            "Socket creation failed : Address family not supported by protocol",        # 2019
            "ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)",
            "Bootstrap : mismatch in rank count from procs 8 : 16",
            "Error while attaching to shared memory segment /dev/shm/nccl-glnlGK (size 14156128), error: No such "
            "file or directory (2)",
            "Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)"]
    assert classify(pd.Series(msgs)).tolist() == ["no_interface", "no_interface", "no_interface", "bootstrap",
                                                  "shm_attach", "resource_shm"]
