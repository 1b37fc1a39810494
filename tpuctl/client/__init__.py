"""The CLI's client of `tpuctl server` (``--server URL``): ``api`` speaks HTTP and hands back the typed
bodies of ``tpuctl.server.wire``; ``submission`` turns a run request into what a server takes."""
