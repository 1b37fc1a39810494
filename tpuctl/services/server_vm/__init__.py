"""Where the team server lives when it is not a laptop: one small always-on Compute Engine VM
(``tpuctl server up|status|logs|down``). ``unit`` is the service unit it runs under, ``backup`` the
ledger's copies in the team bucket, ``reconcile`` what a restored copy learns from the cloud before the
server acts, ``plan`` the requests and steps each command takes (what ``--dry-run`` prints)."""
