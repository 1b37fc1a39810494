"""``tpuctl run`` as a service, one idea per module (docs/architecture.md has the picture):

- ``model``: the run's data (request, target, prepared run, results, recovery policy);
- ``prepare``: validation, program and bundle, and the plan (``--dry-run``);
- ``provision``: the target and the creation of the run's slice;
- ``hosts``: executors and everything that depends on the executor kind or the backend;
- ``attempt``: one start of the program on every host, streamed to its end;
- ``signals``: the signs watched while hosts run (runtime events, the API's slice state, the budget);
- ``supervisor``: the one run lifecycle, one handler per outcome; ``accounting``: its record;
- ``takeover``, ``lease``, ``control``: resuming, leasing, detaching and cancelling runs;
- ``describe``: reading runs back; ``bench``: ``tpuctl bench step``'s pieces;
- ``launcher``: preparing a run, and the steps of one attempt (provision, execute);
- ``rundir``: every path of a run's directory; ``lookup``: which run a user means;
- ``service``: ``Runs``, what the CLI holds (get, list, describe, logs, start, resume, cancel,
  detach), answering with the values of ``views``.

No re-exports here: importing one module must not import them all (CLI start-up).
"""
