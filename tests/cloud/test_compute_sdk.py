"""``compute_sdk.compute_v1()`` imports only the clients tpuctl uses, and a later full import of
google-cloud-compute (a test, another library) still works and gives the very same classes. Each case runs
in a fresh interpreter: this process has likely imported the package already."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
from tpuctl.cloud.compute_sdk import CLIENTS, PACKAGE, compute_v1
sdk = compute_v1()
assert PACKAGE not in sys.modules, "the stand-in package must not stay registered"
loaded = {m.split(".")[4] for m in sys.modules if m.startswith(PACKAGE + ".services.")}
assert loaded == set(CLIENTS.values()), sorted(loaded - set(CLIENTS.values()))[:5]
from google.cloud import compute_v1 as full
assert all(getattr(full, name) is getattr(sdk, name) for name in CLIENTS)
assert full.Instance is sdk.Instance and full.InstanceGroupManager is sdk.InstanceGroupManager
assert len([m for m in sys.modules if m.startswith(PACKAGE + ".services.")]) > 100
print("ok")
"""


def test_only_the_used_clients_load_and_a_full_import_after_reuses_them() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
