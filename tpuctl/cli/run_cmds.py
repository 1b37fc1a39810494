"""`tpuctl run` and `tpuctl runs ...`: run a program on every host of a slice, and look at past runs.

Host output streams to stdout with a worker prefix (stderr for machine formats, so `-o json` stays one
clean document); tpuctl's own steps go to stderr, one line per phase unless -v (``run_console``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuctl.cli.context import ONE_OBJECT, build_settings, is_dry_run, make_output, session
from tpuctl.cli.options import (
    DryRunOpt,
    OutputOpt,
    VerboseOpt,
    WorkspaceOpt,
    refuse_through_server,
    server_of,
)
from tpuctl.cli.placement_flags import (
    ApiOpt,
    CapacityTypeOpt,
    MaxPriceOpt,
    NetworkOpt,
    PreemptibleOpt,
    QueuedOpt,
    RaceKOpt,
    RegionOpt,
    ReservedOpt,
    ServiceAccountOpt,
    SpotOpt,
    StrategyOpt,
    SubnetworkOpt,
    TagsOpt,
    ValidForOpt,
    ZonesOpt,
    host_network_words,
)
from tpuctl.cli.run_console import RunConsole
from tpuctl.cli.run_reading import RUN_HELP as _RUN_HELP
from tpuctl.cli.run_reading import ending_fields, run_logs, short_time
from tpuctl.cli.run_signals import resumable, stop_hosts_on_termination
from tpuctl.words import counted

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpuctl.cli.render import Output
    from tpuctl.server.wire import CancelOut, RunOut
    from tpuctl.services.run.bench import BenchFigures
    from tpuctl.services.run.model import RunRequest, SupervisedResult
    from tpuctl.services.run.views import (
        Cancellation,
        CheckpointFallback,
        Detached,
        LeaseEvent,
        PreemptionView,
        RunDescription,
        RunView,
        SegmentView,
        TimelineBar,
    )
    from tpuctl.settings import Settings

runs_app = typer.Typer(help="List runs, describe one, show its hosts' logs.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks on a (simulated) slice.", no_args_is_help=True)

#: What a table says where JSON says null: a program with no step events has no step figures.
UNKNOWN_STEPS = "unknown (the program reports no steps)"


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        # Options may come before or after SCRIPT; anything tpuctl does not know, and everything after
        # `--`, goes to the program as its arguments.
        context_settings={"allow_extra_args": True},
    )(run)
    runs_app.command("logs")(run_logs)
    app.add_typer(runs_app, name="runs")
    app.add_typer(bench_app, name="bench")


def run(
    ctx: typer.Context,
    script: Annotated[
        str | None,
        typer.Argument(
            metavar="SCRIPT|JOB.yaml",
            help="The Python program to run on every host, or a job file (.yaml/.yml) describing the run.",
        ),
    ] = None,
    args: Annotated[
        list[str] | None, typer.Argument(metavar="[ARGS]...", help="Arguments for the program.")
    ] = None,
    pod: Annotated[str | None, typer.Option("--pod", help="Run on this existing READY slice.")] = None,
    accelerator_type: Annotated[
        str | None,
        typer.Option(
            "--type",
            "--accelerator-type",
            help="Create a slice of this type for the run, e.g. v5e-16. Several, comma-separated "
            "(v5e-16,v6e-8): any of them, in that order of preference (then by price); each type, zone "
            "and capacity is ranked in one plan, and placement fails over from one to the next.",
        ),
    ] = None,
    slices: Annotated[
        str | None,
        typer.Option(
            "--slices",
            metavar="N",
            help="Run on N >= 2 slices of --type joined into one job over the data-center network "
            "(a multislice, placed through one queued resource).",
        ),
    ] = None,
    zone: ZonesOpt = None,
    region: RegionOpt = None,
    capacity_type: CapacityTypeOpt = None,
    spot: SpotOpt = False,
    preemptible: PreemptibleOpt = False,
    reserved: ReservedOpt = None,
    max_price: MaxPriceOpt = None,
    queued: QueuedOpt = False,
    valid_for: ValidForOpt = None,
    strategy: StrategyOpt = None,
    race_k: RaceKOpt = None,
    api: ApiOpt = None,
    network: NetworkOpt = None,
    subnetwork: SubnetworkOpt = None,
    tags: TagsOpt = None,
    service_account: ServiceAccountOpt = None,
    keep_pod: Annotated[
        bool, typer.Option("--keep-pod", help="Keep the slice this run created (default: delete it).")
    ] = False,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE for the program (repeatable).")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="KEY=VALUE label on the run and its slice (repeatable)."),
    ] = None,
    workspace: WorkspaceOpt = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            "--secret",
            metavar="KEY[=VALUE]",
            help="A secret variable for the program; KEY alone takes its value from this environment "
            "(repeatable; never shown or saved in plain text).",
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option("--workdir", help="Directory to ship (default: the script's directory)."),
    ] = None,
    example: Annotated[
        str | None, typer.Option("--example", help="Run a program bundled with tpuctl instead: lm.")
    ] = None,
    checkpoint_every: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-every", metavar="N", help="Checkpoint every N steps (passed to the program)."
        ),
    ] = None,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-dir",
            metavar="gs://BUCKET/PATH",
            help="Where the program checkpoints (TPUCTL_CHECKPOINT_DIR); default: "
            "gs://BUCKET/tpuctl/runs/RUN_ID/checkpoints with --bucket.",
        ),
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option(
            "--bucket", help="Cloud Storage bucket for checkpoints (profile: bucket; the simulator has one)."
        ),
    ] = None,
    setup: Annotated[
        list[str] | None,
        typer.Option(
            "--setup",
            metavar="CMD",
            help="Shell command run on every host after each provision, before the program (repeatable).",
        ),
    ] = None,
    requirements: Annotated[
        str | None,
        typer.Option(
            "--requirements",
            metavar="FILE",
            help="pip requirements installed on every host after each provision.",
        ),
    ] = None,
    runtime_deps: Annotated[
        bool,
        typer.Option(
            "--runtime-deps/--no-runtime-deps",
            help="Install the bundled runtime's pinned JAX, optax and orbax on every host.",
        ),
    ] = True,
    no_import_check: Annotated[
        bool,
        typer.Option(
            "--no-import-check",
            help="Do not check, before creating anything, that the hosts will have every module the "
            "program imports.",
        ),
    ] = False,
    ssh_proxy_command: Annotated[
        str | None,
        typer.Option(
            "--ssh-proxy-command",
            metavar="CMD",
            help="Reach hosts through this ProxyCommand (%h %p %r %n %z), e.g. IAP; no external IPs.",
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout", metavar="DURATION", help="Stop the run after this long: seconds, or 30m, 2h."
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            metavar="BAND",
            help="Its band in a server's queue: production, interactive or batch (the default); the "
            "job file's priority.",
        ),
    ] = None,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            metavar="DURATION",
            help="Seconds between SIGTERM and SIGKILL when stopping hosts (>= 0).",
        ),
    ] = "5",
    executor: Annotated[
        str | None, typer.Option("--executor", help="ssh: every host, simulated or not, is reached over SSH.")
    ] = None,
    max_bundle_mb: Annotated[
        str, typer.Option("--max-bundle-mb", metavar="MIB", help="Refuse bundles bigger than this (MiB).")
    ] = "64",
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            metavar="USD",
            help="Stop the run before it spends more than this many USD (warn at 80%).",
        ),
    ] = None,
    assume_price_per_hour: Annotated[
        str | None,
        typer.Option(
            "--assume-price-per-hour",
            metavar="USD",
            help="With --budget: count a slice tpuctl has no price for at this many USD per hour.",
        ),
    ] = None,
    max_hours: Annotated[
        str | None,
        typer.Option(
            "--max-hours",
            metavar="HOURS",
            help="End the run H hours after it starts and delete its slices, even with tpuctl not running.",
        ),
    ] = None,
    max_restarts: Annotated[
        str,
        typer.Option(
            "--max-restarts", metavar="N", help="Restart a failing program at most N times (not preemptions)."
        ),
    ] = "0",
    max_preemptions: Annotated[
        str,
        typer.Option("--max-preemptions", metavar="N", help="Recover from at most N preemptions, then stop."),
    ] = "10",
    detach: Annotated[
        bool,
        typer.Option("-d", "--detach", help="Supervise the run from a background process; return at once."),
    ] = False,
    verbose: VerboseOpt = False,
    output: OutputOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Run SCRIPT, a job file (JOB.yaml) or --example on every host of a slice and stream their output.

    Ships the script's directory (minus .gitignore/.tpuctlignore) with tpuctl's runtime, starts the
    program on all hosts at once, and ends with its result: if a host fails, the others are stopped and
    the run fails naming it (exit 8). Ctrl-C stops every host (exit 130).

    tpuctl's options may come before or after SCRIPT; the program's own options go after `--` (an option
    tpuctl does not know is refused, with the nearest one it does: a typo must not reach the program), e.g.
    `tpuctl run train.py --type v5e-16 -- --lr 3e-4` or `tpuctl run --example lm --type v5e-8 -- --steps 50`.

    A job file (SkyPilot's task YAML, see `tpuctl job schema`) describes the whole run; a flag given
    beside it replaces the file's value (--env, --label and --secret add to the file's), and --dry-run
    says where each value came from: `tpuctl run job.yaml --type v5e-8 --dry-run`.
    """
    import dataclasses

    from tpuctl.backends import open_backend
    from tpuctl.cli.run_request import plan_fields, run_request
    from tpuctl.jobs.load import is_job_file
    from tpuctl.services.locations import check_region, check_zones
    from tpuctl.services.run.checkpoints import refuse_unrecoverable
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, output, ONE_OBJECT)
    job_file = script if is_job_file(script) else None
    program_args = [*(args or []), *ctx.args]
    if job_file is not None:
        script = None
    elif example is not None and script is not None:
        # With --example every positional is the example's: SCRIPT caught the first of them.
        program_args = [script, *program_args]
        script = None
    # The job file (if any) and the flags typed beside it (each option above is read from ctx), each
    # value parsed once (exit 2 for a bad one, naming the flag or the file's line and key) before
    # anything is contacted.
    job = run_request(ctx, job_file=job_file, script=script, args=program_args)
    request = dataclasses.replace(job.request, executor=executor)
    choices = request.placement
    budget_usd, policy = job.budget_usd, job.policy
    settings = build_settings(ctx, **job.host_flags.as_settings())
    server = server_of(settings)
    if server is not None:  # the server prepares, checks and supervises it
        from tpuctl.cli import runs_remote

        _refuse_through_server(server, executor=executor, no_import_check=no_import_check)
        request = _with_settings(request, settings)
        if is_dry_run(ctx, dry_run):  # the server's plan: where it would place it, with its settings
            _render_plan(out, {**runs_remote.plan(server, job, request), **plan_fields(job)})
            return
        runs_remote.run(out, server, job, request, detach=detach)
        return
    # A run that would lose its work at the first preemption is refused before credentials or requests.
    refuse_unrecoverable(
        request,
        bucket=settings.bucket,
        default_bucket=open_backend(settings).default_bucket,
        defaults=settings.capacity_types or (),
    )
    with session(ctx, out, settings) as sess:
        request = _with_settings(request, sess.settings)
        # A typo is exit 2 with "did you mean" (a zone that offers the type), before anything is made.
        type_name = request.accelerator_type
        accelerator = None if type_name is None else sess.catalog.resolve(type_name)
        check_zones(sess.catalog, sess.cloud, list(choices.zones), accelerator=accelerator)
        if choices.region is not None:
            check_region(sess.catalog, sess.cloud, choices.region)
        runs = Runs(sess)
        # A bad value is exit 2, before the cloud is asked anything.
        prepared = runs.prepare(request, secrets=job.secret_values)
        if not no_import_check:  # a module nothing provides is exit 2, before a slice is made
            imports = runs.check_imports(prepared)
            imports.refuse()
            for warning in imports.warnings():
                out.warn(warning)
        if is_dry_run(ctx, dry_run):
            _render_plan(out, {**runs.plan(prepared, budget_usd=budget_usd), **plan_fields(job)})
            return
        from tpuctl.services.budget import warn_monthly_budget

        if prepared.target.creates:  # the run creates its slice: the monthly budget's warning
            warn_monthly_budget(sess, out.warn)
        if detach:
            _render_detached(out, runs.start_detached(prepared, policy=policy, budget_usd=budget_usd))
            return
        printer = RunConsole(out, prepared.target.hosts, verbose=verbose, clock=sess.monotonic)
        with stop_hosts_on_termination(), out.progress(f"run {prepared.run_id}") as prog, printer.heartbeat():
            printer.spinner = prog
            with resumable(prepared.run_id):
                supervised = runs.start(
                    prepared,
                    observer=printer,
                    policy=policy,
                    budget_usd=budget_usd,
                    warn=out.warn,
                    progress=prog,
                )
    _render_result(out, supervised)


def _with_settings(request: RunRequest, chosen: Settings) -> RunRequest:
    """The request with what the settings choose (flag, environment or profile: each parsed once, by the
    settings)."""
    import dataclasses

    return dataclasses.replace(
        request,
        bucket=chosen.bucket,
        setup=tuple(chosen.setup),
        requirements=None if chosen.requirements is None else str(chosen.requirements),
        ssh_proxy_command=chosen.ssh_proxy_command,
        # The hosts' network as chosen now (flag, environment or profile), kept for every slice of the
        # run: a recovery or `runs resume` must not land its hosts elsewhere.
        placement=dataclasses.replace(
            request.placement, network=chosen.host_network, service_account=chosen.service_account
        ),
    )


def _refuse_through_server(server: str, *, executor: str | None, no_import_check: bool) -> None:
    """Exit 2 for what a run through a server does not carry yet."""
    fix = "drop it, or run without --server"
    if executor is not None:
        refuse_through_server(server, "--executor", fix=fix)
    if no_import_check:
        refuse_through_server(server, "--no-import-check", fix=fix)


_SLICES_FIX = "a multislice has 2 or more slices, e.g. --slices 2; drop --slices to run on one slice"


def _render_result(out: Output, supervised: SupervisedResult) -> None:
    result = supervised.run
    if out.machine:
        from tpuctl.services.run.describe import iso_times

        out.document(out.envelope(run=iso_times(supervised.to_dict())))
        return
    from tpuctl.services.run.views import RecoveryView

    recovery = RecoveryView.of(supervised.summary)
    recovered = ""
    if supervised.preemptions:
        n = len(supervised.preemptions)
        recovered = f"; recovered from {counted(n, 'preemption')} " + (
            f"({counted(recovery.steps_recomputed, 'step')} recomputed"
            + (f", goodput {recovery.goodput:.0%}" if recovery.goodput is not None else "")
            + ")"
            if recovery.steps_recomputed is not None
            else f"(steps recomputed, goodput and waste: {UNKNOWN_STEPS})"
        )
    if supervised.restarts:
        recovered += f"; {counted(supervised.restarts, 'restart')}"
    out.out.print(
        f"[green]run {result.run_id} succeeded[/] on {result.pod} ({result.zone}, "
        f"{counted(result.hosts, 'host')}, {result.capacity}, "
        + ("price unknown" if result.price_per_hour is None else f"{result.price_per_hour:.2f} USD/h")
        + ") "
        f"in {result.duration_s:.1f} s"
        + recovered
        + (f"; {result.pod} deleted" if result.deleted_pod else "")
        + f". Logs: tpuctl runs logs {result.run_id}"
    )


def _render_detached(out: Output, detached: Detached) -> None:
    run_id = detached.run_id
    if out.machine:
        out.document(
            out.envelope(run={"run_id": run_id, "status": "detached", "supervisor": detached.to_dict()})
        )
        return
    out.out.print(
        f"run {run_id} is supervised in the background (pid {detached.pid}, log {detached.log}).\n"
        f"  tpuctl runs describe {run_id}    tpuctl runs logs {run_id}    tpuctl runs cancel {run_id}"
    )


def _render_typed_candidates(out: Output, create: dict[str, Any]) -> None:
    """A run of several slice types: its ranked candidates, each with its type (one line each)."""
    p = out.out.print
    request = create["request"]
    if not request.get("slice_types"):
        return
    p(f"  candidates, every type ranked together ({request['type_preference']}):")
    for c in create["candidates"]:
        if c["rank"] is not None:
            price = "price unknown" if c["price_per_hour"] is None else f"{c['price_per_hour']:.2f} USD/h"
            p(f"    {c['rank']}. {c['accelerator_type']} in {c['zone']} {c['capacity']} ({price})")


def _render_plan(out: Output, plan: dict[str, Any]) -> None:
    if out.machine:
        out.document(out.envelope(dry_run=True, plan=plan))
        return
    import shlex

    from rich.markup import escape

    p = out.out.print
    bundle = plan["bundle"]
    target = plan["target"]
    p("[bold]dry run[/]: nothing was shipped, created or started.")
    p(f"run id: {plan['run_id']}  executor: {plan['executor']}")
    _render_request_lines(p, plan)
    verb = "existing slice" if target["existing"] else "new slice (created for the run"
    verb += "" if target["existing"] else (", deleted after)" if target.get("delete_after") else ", kept)")
    slices = int(target.get("slices") or 1)
    shape = f"{slices} slices x " if slices > 1 else ""
    p(
        f"where: {verb} {target['pod']} in {target['zone']}: {shape}{target['accelerator_type']} "
        f"({target['topology']}, {counted(target['hosts_per_slice'], 'host')} x "
        f"{counted(target['chips_per_host'], 'chip')}"
        + (f" each; {counted(target['hosts'], 'host')} in all" if slices > 1 else "")
        + f"), {target['capacity']}"
    )
    if slices > 1:
        p(f"  slices: {', '.join(target.get('slice_names') or [])}")
    create = target.get("create")
    if create:
        price = create.get("price_per_hour", create.get("estimated_price_per_hour"))
        if price is not None:
            each = target.get("slice_price_per_hour")
            per = f" ({each:.2f} USD/h per slice)" if slices > 1 and each is not None else ""
            p(f"  estimated price: {price:.2f} USD/h{per}")
        if create.get("message"):
            p(f"  placement: {escape(str(create['message']))}")
        _render_typed_candidates(out, create)
        hosts = host_network_words(create["request"])
        if hosts is not None:
            p(f"  {escape(hosts)}")
        for req in create.get("requests", []):
            p(f"  request: {req['method']} {escape(req['url'])}")
    p(
        f"bundle: sha256 {bundle['sha256']}, {bundle['files']} files, {bundle['bytes']} bytes "
        f"(limit {bundle['limit_bytes']}); from {bundle['workdir'] or '(runtime only)'}"
    )
    for f in bundle["user_files"]:
        p(f"  {f['bytes']:>10}  {escape(f['path'])}")
    p(f"  {'':>10}  + tpuctl runtime ({bundle['runtime_files']} files)")
    p(f"checkpoint dir: {plan['checkpoint_dir']}")
    for line in _host_python_lines(plan["setup"]["host_python"]):
        p(line)
    for host in plan["hosts"]:
        p(f"[bold]host {host['worker']}[/]: {escape(host['where'])}")
        p(f"  cwd: {escape(host['cwd'])}")
        if "command" in host:
            p(f"  command: {escape(host['command'])}")
        else:
            p(f"  argv: {escape(shlex.join(host['argv']))}")
        for key, value in host["env"].items():
            p(f"  env {key}={escape(value)}")


def _render_request_lines(p: Any, plan: dict[str, Any]) -> None:
    """The plan's lines about the request itself (``run_request.plan_fields``): where each value came
    from, the slice types a run may take, its secrets by name."""
    from rich.markup import escape

    types = plan.get("accelerator_types")
    if types:
        rank = (
            "the cheapest first" if plan.get("type_preference") == "cheapest" else "in this order, then price"
        )
        p(f"slice types: {', '.join(types)} ({rank})")
    for name in plan.get("secrets") or {}:
        p(f"secret {name}=<secret>")
    sources = plan.get("sources") or {}
    if sources:
        p("values from:")
        for name, origin in sources.items():
            p(f"  {name}: {escape(origin)}")


def _host_python_lines(host_python: dict[str, Any]) -> list[str]:
    """The plan's Python lines: the image's, the environment's, and how a difference is bridged."""
    from rich.markup import escape

    image = host_python["image"]
    environment = host_python["environment"]
    has = f"python{image}" if image else "a python3 tpuctl does not know"
    uses = (
        f"the run's environment uses python{environment}"
        if environment
        else "no environment: the image's python3 runs the program"
    )
    lines = [f"python: the image has {has}; {uses}"]
    if host_python["handling"]:
        lines.append(f"  {escape(host_python['handling'])}")
    if host_python["warning"]:
        lines.append(f"  [yellow]warning[/]: {escape(host_python['warning'])}")
    return lines


# --- runs ----------------------------------------------------------------------------------------------


_RUN_COLUMNS = ("RUN", "STATUS", "WORKSPACE", "USER", "PROGRAM", "POD", "ZONE", "TYPE", "EXIT",
                "PREEMPTIONS", "RESTARTS", "STARTED (UTC)", "DURATION S")  # fmt: skip


@runs_app.command("list")
def list_runs(
    ctx: typer.Context,
    limit: Annotated[
        str, typer.Option("--limit", metavar="N", help="Show at most this many (newest first).")
    ] = "50",
    workspace: Annotated[
        str | None, typer.Option("--workspace", metavar="NAME", help="Only the runs of this workspace.")
    ] = None,
    user: Annotated[
        str | None,
        typer.Option("--user", metavar="EMAIL", help="Only the runs this principal submitted."),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """List runs, newest first, with the workspace each uses and who submitted it."""
    from tpuctl import params
    from tpuctl.services.run.service import Runs
    from tpuctl.services.run.views import RunView

    out = make_output(ctx, output)
    count = params.whole(limit, "limit")
    settings = build_settings(ctx)
    server = server_of(settings)
    views: Sequence[RunView | RunOut]
    if server is not None:
        from tpuctl.cli import runs_remote

        views = runs_remote.listed(server, count, workspace=workspace, principal=user)
    else:
        with session(ctx, out, settings) as sess:
            views = Runs(sess).list_runs(limit=count, workspace=workspace, principal=user)
    out.rows(
        "runs",
        _RUN_COLUMNS,
        (
            [
                v.run_id,
                v.status,
                v.workspace,
                v.principal,
                v.program,
                v.pod,
                v.zone,
                v.accelerator_type,
                v.exit_code,
                v.preemptions,
                v.restarts,
                short_time(v.created_at),
                v.duration_s,
            ]
            for v in views
        ),
        key="runs",
        records=[v.to_dict() if isinstance(v, RunView) else v.model_dump() for v in views],
        keep=frozenset({"RUN", "STATUS", "WORKSPACE", "USER", "POD", "ZONE"}),
        drop=("PROGRAM", "STARTED (UTC)", "RESTARTS", "EXIT", "DURATION S", "PREEMPTIONS"),
    )


@runs_app.command("describe")
def describe_run(
    ctx: typer.Context,
    run_id: Annotated[str | None, typer.Argument(metavar="RUN", help=_RUN_HELP + " Default: latest.")] = None,
    output: OutputOpt = None,
) -> None:
    """Show one run: status, slice, exit code, its segments (a timeline), and what preemptions cost:
    steps completed and recomputed, goodput, detection latency and recovery time of each."""
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    server = server_of(settings)
    if server is not None:
        from tpuctl.cli import runs_remote

        runs_remote.describe(out, server, run_id)
        return
    with session(ctx, out, settings) as sess:
        described = Runs(sess).describe(run_id)
    if out.machine:
        out.document(out.envelope(run=described.to_dict()))
        return
    _render_description(out, described)


def _render_description(out: Output, described: RunDescription) -> None:
    recovery = described.recovery
    out.fields(f"run {described.run.run_id}", _description_fields(described))
    _render_segments(out, described.segments)
    _render_timeline(out, described.timeline)
    _render_preemptions(out, recovery.preemptions, records=list(recovery.record.get("preemptions") or []))
    _render_fallbacks(out, recovery.checkpoint_fallbacks)
    _render_lease_history(out, described)


def _render_lease_history(out: Output, described: RunDescription) -> None:
    """The lease's last steps (the table keeps the last 8; -o json has them all). A claim's renewals are
    one step, at the latest, with their count."""
    events = described.lease_history
    if not events:
        return

    def action(event: LeaseEvent) -> str:
        renewals = (event.detail or {}).get("renewals")
        return f"{event.action} x{renewals}" if renewals and renewals > 1 else event.action

    out.rows(
        "lease history" + (f" (last 8 of {len(events)})" if len(events) > 8 else ""),
        ("AT", "ACTION", "GEN", "HOST", "PID", "OWNER", "EXPIRES AT"),
        ([e.at, action(e), e.generation, e.host, e.pid, e.owner_id, e.expires_at] for e in events[-8:]),
        key="lease_history",
        records=[e.to_dict() for e in events],
    )


def _description_fields(described: RunDescription) -> dict[str, Any]:
    """The run's own fields, its recovery figures and what its detail holds."""
    run, recovery = described.run, described.recovery
    fields: dict[str, Any] = {
        "status": run.status,
        "program": run.program,
        "pod": run.pod,
        "zone": run.zone,
        "accelerator_type": run.accelerator_type,
        "capacity": run.capacity,
        "exit_code": run.exit_code,
        "created_at": run.created_at,
        "ended_at": run.ended_at,
        "duration_s": run.duration_s,
        "restarts": run.restarts,
        "preemptions": run.preemptions,
        "supervisor": described.supervisor_state,
        **({} if described.queue is None else described.queue.lines()),
    }
    figures = {
        "steps_completed": recovery.steps_completed,
        "steps_recomputed": recovery.steps_recomputed,
        "goodput": recovery.goodput,
        "productive_step_s": recovery.productive_step_s,
        "wall_s": recovery.wall_s,
    }
    for key, value in figures.items():
        unknown = recovery.steps_reported is False and key != "wall_s"
        fields[key] = UNKNOWN_STEPS if unknown else value
    recorded = {
        "hosts": run.hosts,
        "executor": run.executor,
        "checkpoint_dir": run.checkpoint_dir,
        "log_dir": run.log_dir,
        "error": run.error,
    }
    fields.update({key: value for key, value in recorded.items() if value is not None})
    fields.update(ending_fields(described))
    return fields


def _render_segments(out: Output, segs: tuple[SegmentView, ...]) -> None:
    out.rows(
        "segments",
        ("#", "KIND", "START", "DURATION S", "POD", "ZONE", "CAPACITY", "STEPS", "RECOMPUTED"),
        (
            [
                i,
                s.kind,
                s.start,
                s.duration_s,
                s.pod,
                s.zone,
                s.capacity,
                s.steps_completed,
                s.steps_recomputed,
            ]
            for i, s in enumerate(segs, 1)
        ),
        key="segments",
        records=[s.to_dict() for s in segs],
    )


def _render_timeline(out: Output, timeline: tuple[TimelineBar, ...]) -> None:
    """One bar per segment, placed and sized by its share of the run's wall time."""
    if not timeline:
        return
    out.out.print("[bold]timeline[/]")
    colours = {"provisioning": "blue", "running": "green", "checkpointing": "yellow",
               "preempted": "red", "recovering": "magenta"}  # fmt: skip
    for bar in timeline:
        colour = colours.get(bar.kind, "white")
        blocks = " " * bar.offset + "█" * max(1, bar.width)
        out.out.print(f"  {bar.kind:<13} [{colour}]{blocks}[/] {bar.duration_s:.1f} s", highlight=False)


def _render_preemptions(
    out: Output, preemptions: tuple[PreemptionView, ...], *, records: list[dict[str, Any]]
) -> None:
    if not preemptions:
        return
    out.rows(
        "preemptions",
        ("#", "KIND", "POD", "ZONE", "CHECKPOINT", "DETECTED IN", "RECOVERED IN", "NEW ZONE", "RECOMPUTED"),
        (
            [
                p.number,
                p.kind,
                p.pod,
                p.zone,
                p.checkpoint_step,
                _secs(p.detection_latency_s),
                _secs(p.recovery_s),
                p.new_zone,
                p.steps_recomputed,
            ]
            for p in preemptions
        ),
        key="preemptions",
        records=records,
    )
    for p in preemptions:  # a multislice: which slice went, and what was placed again
        if p.replaced_slices:
            out.out.print(
                f"preemption {p.number}: slice {', '.join(p.lost_slices or ['?'])} was lost; "
                f"re-placed the whole set ({', '.join(p.replaced_slices)}) as {p.new_pod}",
                highlight=False,
            )


def _render_fallbacks(out: Output, fallbacks: tuple[CheckpointFallback, ...]) -> None:
    """Checkpoints skipped on restore (unreadable, incomplete...) and the one restored instead."""
    from rich.markup import escape

    for fallback in fallbacks:
        skipped = ", ".join(f"step {s.step} ({s.reason})" for s in fallback.skipped)
        out.out.print(f"checkpoint fallback: skipped {escape(skipped)}; restored step {fallback.restored}")


def _secs(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f} s"


@runs_app.command("resume")
def resume_run(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help=_RUN_HELP)],
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Supervise it from a background process.")
    ] = False,
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget", metavar="USD", help="A new budget in USD for the whole run (spent so far counts)."
        ),
    ] = None,
    max_preemptions_flag: Annotated[
        str | None,
        typer.Option("--max-preemptions", metavar="N", help="A new preemption cap (default: the run's)."),
    ] = None,
    verbose: VerboseOpt = False,
    output: OutputOpt = None,
) -> None:
    """Take over a run whose supervisor is gone (killed, machine rebooted) or that stopped (budget,
    cancel, failure) and carry it on from its last good checkpoint."""
    from tpuctl import params
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, output, ONE_OBJECT)
    new_budget = None if budget is None else params.usd(budget, "budget")
    max_preemptions = (
        None
        if max_preemptions_flag is None
        else params.whole(max_preemptions_flag, "max_preemptions", minimum=0)
    )
    server = server_of(build_settings(ctx))
    if server is not None:  # a replica carries it on
        from tpuctl.cli import runs_remote

        runs_remote.resume(
            out, server, run_id, budget_usd=new_budget, max_preemptions=max_preemptions, detach=detach
        )
        return
    with session(ctx, out) as sess:
        runs = Runs(sess)
        ready = runs.resume(run_id, budget_usd=new_budget, max_preemptions=max_preemptions)
        if ready.note:
            out.warn(ready.note)
        if detach:
            _render_detached(out, runs.detach(ready.run_id, resume=True))
            return
        printer = RunConsole(out, ready.hosts, verbose=verbose, clock=sess.monotonic)
        with stop_hosts_on_termination(), out.progress(f"resume {ready.run_id}") as prog, printer.heartbeat():
            printer.spinner = prog
            supervised = runs.supervise(ready, observer=printer, warn=out.warn, progress=prog)
    _render_result(out, supervised)


@runs_app.command("cancel")
def cancel_run(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help=_RUN_HELP)],
    output: OutputOpt = None,
) -> None:
    """Stop a run: its hosts checkpoint and stop, its slice is deleted, it is recorded as cancelled."""
    from tpuctl.services.run.service import Runs
    from tpuctl.services.run.views import Cancellation

    out = make_output(ctx, output, ONE_OBJECT)
    settings = build_settings(ctx)
    server = server_of(settings)
    result: Cancellation | CancelOut
    if server is not None:
        from tpuctl.cli import runs_remote

        result = runs_remote.cancel(server, run_id)
    else:
        with session(ctx, out, settings) as sess:
            result = Runs(sess).cancel(run_id, progress=out.note)
    if out.machine:
        document = (
            result.to_dict() if isinstance(result, Cancellation) else result.model_dump(exclude_unset=True)
        )
        out.document(out.envelope(cancel=document))
        return
    if not result.cancelled:
        out.note(f"run {result.run_id}: {result.note} ({result.status})")
        return
    out.out.print(f"run {result.run_id} cancelled" + (f" by {result.by}" if result.by else "")
                  + (f"; deleted {result.deleted}" if result.deleted else ""))  # fmt: skip


@runs_app.command("supervise", hidden=True)
def supervise_run(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    resume: Annotated[bool, typer.Option("--resume")] = False,
) -> None:
    """Internal: the background supervisor of a --detach run (started by tpuctl itself)."""
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, None)
    with session(ctx, out) as sess:
        runs = Runs(sess)
        ready = runs.reload(run_id)
        if ready.note:
            out.warn(ready.note)
        with stop_hosts_on_termination(), resumable(ready.run_id):
            # Its output is the supervisor's log file: every detail goes there.
            observer = RunConsole(out, ready.hosts, verbose=True)
            supervised = runs.supervise(ready, observer=observer, warn=out.warn, resume=resume)
    _render_result(out, supervised)


# --- bench ----------------------------------------------------------------------------------------------


@bench_app.command("step")
def bench_step(
    ctx: typer.Context,
    accelerator_type: Annotated[str, typer.Argument(metavar="TYPE", help="Slice type, e.g. v5e-16.")],
    pod: Annotated[str | None, typer.Option("--pod", help="Use this existing READY slice (of TYPE).")] = None,
    slices: Annotated[
        str | None,
        typer.Option("--slices", metavar="N", help="Run on N >= 2 slices of TYPE joined into one job."),
    ] = None,
    zone: Annotated[str | None, typer.Option("--zone", help="Zone to create the slice in.")] = None,
    steps: Annotated[str, typer.Option("--steps", metavar="N", help="Timed steps.")] = "10",
    batch_per_device: Annotated[
        str, typer.Option("--batch-per-device", metavar="N", help="Sequences per device per step.")
    ] = "2",
    seq_len: Annotated[str, typer.Option("--seq-len", metavar="N", help="Tokens per sequence.")] = "128",
    d_model: Annotated[str, typer.Option("--d-model", metavar="N", help="Model width.")] = "256",
    layers: Annotated[str, typer.Option("--layers", metavar="N", help="Transformer layers.")] = "2",
    compute_dtype: Annotated[
        str, typer.Option("--compute-dtype", help="float32 or bfloat16 (fp32 master weights).")
    ] = "float32",
    matmul_n: Annotated[
        str,
        typer.Option("--matmul-n", metavar="N", help="Square matmul size for the simulator's measured peak."),
    ] = "2048",
    keep_pod: Annotated[bool, typer.Option("--keep-pod", help="Keep a slice created for this.")] = False,
    output: OutputOpt = None,
) -> None:
    """Run the bundled train step on every host of a slice; report step time, tokens/s, achieved
    TFLOP/s and the fraction of peak (the catalog's on TPU; on the simulator, a large matmul measured
    on the same CPU in the same run)."""
    from tpuctl import params
    from tpuctl.errors import TpuctlError, UsageError
    from tpuctl.services.placement_choices import PlacementChoices
    from tpuctl.services.run.bench import BenchCollector, bench_step_figures, bench_step_program
    from tpuctl.services.run.model import RecoveryPolicy, RunRequest
    from tpuctl.services.run.service import Runs

    out = make_output(ctx, output, ONE_OBJECT)
    sizes = {"steps": steps, "batch_per_device": batch_per_device, "seq_len": seq_len, "d_model": d_model,
             "layers": layers, "matmul_n": matmul_n}  # fmt: skip
    # The program gets them as flags again: each checked here (a whole number >= 1) and passed on as given.
    program_args: tuple[str, ...] = ()
    for name, value in sizes.items():
        program_args += (params.flag(name), str(params.whole(value, name)))
    if compute_dtype not in ("float32", "bfloat16"):
        raise UsageError(
            f"unknown --compute-dtype {compute_dtype!r}",
            field="compute_dtype",
            value=compute_dtype,
            fix="use float32 or bfloat16",
        )
    program_args += ("--compute-dtype", compute_dtype)
    with session(ctx, out) as sess:
        accel = sess.catalog.resolve(accelerator_type)
        request = RunRequest(
            script=str(bench_step_program()),
            args=program_args,
            pod=pod,
            accelerator_type=None if pod else accelerator_type,
            slices=1 if slices is None else params.whole(slices, "slices", minimum=2, fix=_SLICES_FIX),
            placement=PlacementChoices(zones=() if zone is None else (params.zone(zone),)),
            keep_pod=keep_pod,
        )
        runs = Runs(sess)
        prepared = runs.prepare(request)
        if prepared.target.accelerator.api_name != accel.api_name:
            raise UsageError(
                f"pod {pod} is a {prepared.target.accelerator.friendly_name}, not a {accel.friendly_name}",
                field="pod",
                value=pod,
                fix=f"pass TYPE {prepared.target.accelerator.friendly_name}, or drop --pod",
            )
        printer = RunConsole(out, prepared.target.hosts, clock=sess.monotonic)
        collector = BenchCollector(printer if not out.machine else None)
        bench = out.progress(f"bench step on {accel.friendly_name}")
        with stop_hosts_on_termination(), bench as prog, printer.heartbeat():
            printer.spinner = prog
            # Supervised as `tpuctl run` is, with recovery off: the first failure or preemption ends it.
            supervised = runs.start(prepared, observer=collector, policy=RecoveryPolicy.off(), progress=prog)
    run_id = supervised.run.run_id
    if collector.result is None:
        raise TpuctlError(
            f"the bench program printed no result (run {run_id})",
            fix=f"see `tpuctl runs logs {run_id} --worker 0`",
        )
    figures = bench_step_figures(collector.result, accel, run_id=run_id, slices=prepared.target.slices)
    if out.machine:
        out.document(out.envelope(bench=figures.to_dict()))
        return
    _render_bench(out, accel.friendly_name, figures)


def _render_bench(out: Output, accelerator: str, figures: BenchFigures) -> None:
    peak, fraction, hosts = figures.peak_tflops, figures.fraction_of_peak, figures.hosts or 0
    out.fields(
        f"bench step {accelerator}",
        {
            "slices x hosts x devices": f"{figures.slices} x "
            f"{hosts // figures.slices} x {(figures.devices or 0) // max(hosts, 1)}",
            "model": f"{(figures.params or 0) / 1e6:.2f}M params, batch "
            f"{figures.global_batch}x{figures.seq_len}, {figures.compute_dtype}",
            "step time": f"{figures.step_time_s * 1e3:.1f} ms",
            "tokens/s": f"{figures.tokens_per_s:.0f}",
            "achieved": f"{figures.achieved_tflops:.4f} TFLOP/s",
            "peak": "-" if peak is None else f"{peak:.4f} TFLOP/s ({figures.peak_source})",
            "fraction of peak": "-" if fraction is None else f"{fraction:.1%}",
            "run": figures.run_id,
        },
    )
