"""Job files: a run described once, in SkyPilot's task YAML where the concept is the same (docs/jobs.md).

``source`` reads the YAML keeping each key's line, ``model`` is the format (and its JSON Schema),
``accelerators`` resolves SkyPilot's accelerator names, ``located`` turns a bad value into an error that
names the file, the line and the key, and ``request`` turns a file, with the flags given beside it, into
tpuctl's typed run request (``JobRequest``); ``document`` turns a run request into a job document and
back: the request's one serialised form (what a run saves, what a server takes).
"""
