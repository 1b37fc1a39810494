"""The dashboard: tpuctl's runs, slices and money as web pages, served by `tpuctl dashboard` over the
local ledger and by `tpuctl server` at ``/``.

- ``svg``: the charts, drawn here as SVG (no charting library, no script), each mark carrying ``data-*``
  attributes that say what it is (so a test, or a person reading the source, can check what is drawn).
- ``pages``: what each page shows, read from the same services the CLI's ``-o json`` prints.
- ``routes``: the pages as a FastAPI router (Jinja2 templates in ``templates/``, rendered on the server).
- ``serve``: `tpuctl dashboard`'s own process: the router alone, on a loopback address.
"""
