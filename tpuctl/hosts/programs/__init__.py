"""Programs tpuctl itself ships to hosts as the run's script (``tpuctl bench step``). Each is a plain
script using only the runtime's public API (``tpuctl.runtime``), which the bundle carries; nothing here is
imported by the CLI."""
