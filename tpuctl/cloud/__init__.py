"""The boundary to the provider: the ``TpuCloud`` interface (``base``), its one implementation for the TPU API
(``tpu_api.TpuApiCloud``), the Cloud Quotas client (``quotas``), error translation (``translate``),
retry policies (``retry``), and what a backend hands every client it builds (``config``, ``credentials``).

Import the submodules you need; this package imports nothing heavy on purpose (``tpuctl --help`` must stay
fast), so ``google.cloud.tpu_v2`` is loaded only when a ``TpuApiCloud`` first talks to the API.
"""
