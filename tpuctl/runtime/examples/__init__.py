"""Built-in example programs (``tpuctl run --example NAME``)."""
