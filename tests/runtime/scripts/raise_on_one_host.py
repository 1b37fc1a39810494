"""An unmodified user program: process 1 raises after joining the job; process 0 stays busy (no
collective, so nothing tells it that host 1 is gone) and never reaches JAX's shutdown barrier. Without
the crash hook, process 1 would wait there for it (jax.distributed's atexit shutdown)."""

import time

import jax
from jax.experimental import multihost_utils

jax.distributed.initialize()
multihost_utils.sync_global_devices("joined")
if jax.process_index() == 1:
    print(f"raising_at {time.time()}", flush=True)
    raise ValueError("boom on host 1\nat step 30")
time.sleep(120)
