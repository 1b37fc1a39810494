"""`tpuctl job ...`: the job-file format itself: its JSON Schema, for editors and CI (`job schema`), and
a file checked as `tpuctl run` would check it, without contacting anything (`job check`)."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuctl.cli.context import ONE_OBJECT, make_output
from tpuctl.cli.options import OutputOpt

app = typer.Typer(help="Job files: their JSON Schema, and a file checked.", no_args_is_help=True)


@app.command("schema")
def schema() -> None:
    """Print the job file's JSON Schema (draft 2020-12), e.g. for an editor's YAML language server:
    `tpuctl job schema > tpuctl-job.schema.json`."""
    import json

    from tpuctl.jobs.schema import job_schema

    typer.echo(json.dumps(job_schema(), indent=2, sort_keys=True))


@app.command("check")
def check(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(metavar="JOB.yaml", help="The job file to check.")],
    output: OutputOpt = None,
) -> None:
    """Check a job file as `tpuctl run` would (its keys, types, values and slice types), contacting
    nothing; exit 2 naming the line and key of the first problem."""
    from pathlib import Path

    from tpuctl.catalog import Catalog
    from tpuctl.jobs.load import load_job
    from tpuctl.jobs.request import build

    out = make_output(ctx, output, ONE_OBJECT)
    loaded = load_job(Path(path))
    job = build(loaded.values, catalog=Catalog.load(), source=loaded.source)
    request = job.request
    types = [t for t in (request.accelerator_type, *request.other_accelerator_types) if t]
    fields = {
        "file": path,
        "slice types": ", ".join(types) or "-",
        "program": request.command or request.script or (request.example and f"example:{request.example}"),
        "secrets": ", ".join(request.secret_names) or "-",
    }
    if out.machine:
        out.document(out.envelope(job={**fields, "valid": True}))
        return
    out.fields(f"{path} is a valid job file", fields)
