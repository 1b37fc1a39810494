"""An ASGI app served by uvicorn in a thread on a loopback port, for the tests that need a real socket
(a browser, the CLI's HTTP client). (A module of its own: tests/ has several conftest.py.)"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from tpuctl.testing.clock import wait_for
from tpuctl.testing.ports import unused_port


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on a loopback port: its base URL."""
    import uvicorn

    port = unused_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20, what="the dashboard to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
