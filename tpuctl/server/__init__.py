"""`tpuctl server`: an HTTP API over the ledger and the run supervisors in one process (``serve``).

``wire`` is what server and client say to each other; ``app`` the API; ``submit`` how a submission
becomes a recorded run; ``bundles`` where uploaded programs wait for their run; ``replica`` the loop
that supervises every run nobody holds; ``membership`` this server's place among the ledger's servers;
``problems`` how every error becomes the CLI's error document. Nothing here asks which database engine
is under the ledger: the ledger says how many servers it takes (``Ledger.max_replicas``).
"""
