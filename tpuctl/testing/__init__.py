"""Real implementations of tpuctl's interfaces for tests, as httpx ships ``MockTransport``.

- ``clock``: ``FakeClock`` (simulated time that only moves when told) and ``wait_for`` (a bounded
  real-time poll, for waits on real processes and files).
- ``cli``: ``invoke``, the one in-process runner of the ``tpuctl`` command line.
- ``cloud``: ``InProcessCloud``, the real ``TpuApiCloud`` over the simulator's route table, with no socket.

Nothing here is imported by tpuctl itself; each module imports what it needs when it is used.
"""
