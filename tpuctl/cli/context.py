"""Per-command plumbing for the CLI: merge global and command options into Settings, open the session,
print the backend marker, and map exceptions to exit codes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tpuctl.cli.render import Output

if TYPE_CHECKING:
    from tpuctl.backends.base import Backend
    from tpuctl.errors import UsageError
    from tpuctl.services.session import Session
    from tpuctl.settings import Settings

OUTPUT_FORMATS = ("table", "json", "yaml", "csv")


@dataclass
class GlobalOptions:
    """The options given before the command (commands merge them with their own), and the Output the
    command chose, so that an error raised anywhere is rendered in the format the user asked for."""

    profile: str | None = None
    project: str | None = None
    output: str | None = None
    dry_run: bool = False
    yes: bool = False
    state_dir: Path | None = None
    database: str | None = None
    server: str | None = None
    config: Path | None = None
    backend: str | None = None
    current_output: Output | None = None
    #: A backend handed to ``run()`` (a test's in-process simulator): every session opens it instead of
    #: the one the settings choose.
    given_backend: Backend | None = None


def global_options(ctx: typer.Context) -> GlobalOptions:
    obj = ctx.find_root().obj
    if not isinstance(obj, GlobalOptions):
        obj = GlobalOptions()
        ctx.find_root().obj = obj
    return obj


def output_format(ctx: typer.Context, command_output: str | None) -> str:
    given = command_output or global_options(ctx).output
    fmt = given or os.environ.get("TPUCTL_OUTPUT") or "table"
    if fmt not in OUTPUT_FORMATS:
        from tpuctl.errors import UsageError

        raise UsageError(
            f"unknown output format {fmt!r}",
            field="-o/--output" if given else "TPUCTL_OUTPUT",
            value=fmt,
            fix="use one of: " + ", ".join(OUTPUT_FORMATS),
        )
    return fmt


#: The formats of a command that shows one object (CSV is for lists).
ONE_OBJECT = ("table", "json", "yaml")


def make_output(
    ctx: typer.Context, command_output: str | None, formats: tuple[str, ...] | None = None
) -> Output:
    """The command's output in the chosen format; ``formats``: the ones that apply to this command
    (another is refused, exit 2, rather than silently printed as something else)."""
    # Record the chosen format early so an error raised later is rendered in it.
    out = Output(fmt=output_format(ctx, command_output))
    global_options(ctx).current_output = out
    if formats is not None and out.fmt not in formats:
        from tpuctl.errors import UsageError

        chosen = out.fmt
        out.fmt = "table"  # the refusal itself is a message, not a document in the refused format
        command = ctx.command_path.removeprefix("tpuctl ") if ctx.command_path else "this command"
        raise UsageError(
            f"-o {chosen} does not apply to `{command}`",
            field="output",
            value=chosen,
            fix=f"use -o {', -o '.join(formats)}",
        )
    return out


def build_settings(ctx: typer.Context, **flags: Any) -> Settings:
    from tpuctl.settings import load_settings

    opts = global_options(ctx)
    merged: dict[str, Any] = {
        "profile": opts.profile,
        "project": opts.project,
        "state_dir": opts.state_dir,
        "database": opts.database,
        "server": opts.server,
        "config_file": opts.config,
        "backend": opts.backend,
    }
    merged.update({k: v for k, v in flags.items() if v is not None})
    return load_settings(merged)


def is_dry_run(ctx: typer.Context, command_dry_run: bool) -> bool:
    return command_dry_run or bool(global_options(ctx).dry_run)


def assume_yes(ctx: typer.Context, command_yes: bool) -> bool:
    return command_yes or bool(global_options(ctx).yes)


def stdin_is_tty() -> bool:
    """Whether a question can be asked (tests replace this to answer one)."""
    import sys

    return sys.stdin is not None and sys.stdin.isatty()


def confirm(ctx: typer.Context, yes: bool, question: str, out: Output) -> None:
    """Ask ``question`` before a destructive step, unless -y was given. "n" (or Enter) is ``Aborted``
    (exit 1); with no terminal to ask on it is a usage error (exit 2) asking for -y: a script must say
    so, and must never hang on a question nobody sees."""
    from tpuctl.errors import Aborted, UsageError

    if assume_yes(ctx, yes):
        return
    if not stdin_is_tty():
        raise UsageError(
            f"{question} (needs a confirmation, and there is no terminal to ask on)",
            field="--yes",
            fix="pass -y to confirm",
        )
    # The question goes to stderr with a machine format, so stdout stays one document.
    try:
        agreed = typer.confirm(question, default=False, err=out.machine)
    except typer.Abort:  # end of input or Ctrl-C at the question: no answer is no
        agreed = False
    if not agreed:
        raise Aborted("aborted: nothing was changed")


@contextmanager
def session(
    ctx: typer.Context, out: Output, settings: Settings | None = None, **flags: Any
) -> Iterator[Session]:
    """Open the backend for one command and say which it is; ``settings`` when the command built them
    already (with its ``flags``)."""
    from tpuctl.cloud.surfaces import notes_of
    from tpuctl.services.session import open_session

    settings = settings or build_settings(ctx, **flags)
    with open_session(settings, backend=global_options(ctx).given_backend) as sess:
        label = sess.backend.label
        detail = f", state {_home(sess.state_dir)}" if label.names_state_dir else ""
        ambient = settings.project_from if label.names_ambient_project else None
        if ambient:
            # A real project chosen by a variable another tool set: say so, whatever the output format.
            detail += f", taken from {ambient}; pass --project or set TPUCTL_PROJECT to choose it yourself"
            if out.machine:
                out.err.print(f"{label.name}: project {sess.project} taken from {ambient}")
        out.backend_banner(label, sess.project, detail)
        yield sess
        # What the cloud could not see (a surface the caller has no permission on), said once.
        for line in notes_of(sess.cloud):
            out.note(f"note: {line}")


def backend_for(ctx: typer.Context, settings: Settings) -> Backend:
    """The backend of a command that needs one outside a session: the given one, else the settings'."""
    from tpuctl.backends import open_backend

    return global_options(ctx).given_backend or open_backend(settings)


def clock(ctx: typer.Context) -> Callable[[], float]:
    """Now, for a command that reads the time outside a session: the given backend's own time where it
    keeps one (``Backend.timekeeping``: a test's fake clock), else the wall clock."""
    given = global_options(ctx).given_backend
    return given.timekeeping.clock if given is not None else time.time


def _home(path: Path) -> str:
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def exit_code_for(exc: BaseException, argv: list[str], opts: GlobalOptions) -> int:
    """Render ``exc`` and return the exit code: tpuctl errors by class, usage errors 2, Ctrl-C 130."""
    from tpuctl.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, TpuctlError, UsageError

    out = opts.current_output or _output_from_argv(argv)
    if isinstance(exc, (typer.Abort, KeyboardInterrupt)):
        out.err.print("[red]interrupted[/]")
        return EXIT_INTERRUPTED
    if isinstance(exc, typer.Exit):
        return exc.exit_code
    if _is_framework_error(exc):
        # The CLI framework's own usage errors (missing argument, unknown option): one line, exit 2, no
        # traceback. Matched by class name: typer 0.29+ vendors click, older typers raise click's own.
        if type(exc).__name__ == "NoArgsIsHelpError":
            out.err.print(exc.format_message(), markup=False, highlight=False)  # type: ignore[attr-defined]
            return EXIT_USAGE
        command_ctx = getattr(exc, "ctx", None)
        hint = f"{command_ctx.command_path} --help" if command_ctx is not None else "tpuctl --help"
        message = exc.format_message()  # type: ignore[attr-defined]
        code = getattr(exc, "exit_code", EXIT_ERROR)
        unknown = _unknown_option(exc, hint)
        if unknown is not None:
            out.error(unknown)
            return EXIT_USAGE
        if code == EXIT_USAGE:
            out.error(UsageError(message, field=_param_name(exc), fix=f"see `{hint}`"))
            return EXIT_USAGE
        out.error(TpuctlError(message))
        return code or EXIT_ERROR
    if isinstance(exc, UsageError):
        from tpuctl.params import flag_error

        exc = flag_error(exc)
    if isinstance(exc, TpuctlError):
        out.error(exc)
        return exc.exit_code
    # A bug: say so plainly, with the type, and where to see the traceback.
    if os.environ.get("TPUCTL_DEBUG"):
        import traceback

        traceback.print_exception(exc)
    out.error(
        TpuctlError(
            f"internal error: {type(exc).__name__}: {exc}",
            fix="re-run with TPUCTL_DEBUG=1 for the traceback and report it",
        )
    )
    return EXIT_ERROR


def _unknown_option(exc: BaseException, hint: str) -> UsageError | None:
    """An option the command does not know, with the nearest one it does ("did you mean"); for `run`, whose
    program takes options of its own, also how to pass it to the program (after `--`). A typo such as
    --preemptable must never reach the program silently: it would have run on the wrong capacity."""
    import difflib

    from tpuctl.errors import UsageError

    option = getattr(exc, "option_name", None)
    if type(exc).__name__ != "NoSuchOption" or not option:
        return None
    known = sorted(getattr(exc, "possibilities", None) or [])
    command_ctx = getattr(exc, "ctx", None)
    if command_ctx is not None:
        known = command_options(command_ctx.command)
    # Only options the command has: never an argument's internal name (TYPE's is accelerator_type).
    known = [o for o in known if o.startswith("-")]
    if option in OTHER_TOOLS_NAMES:  # another tool's flag: its meaning here, or nothing near in spelling
        near = [OTHER_TOOLS_NAMES[option]] if OTHER_TOOLS_NAMES[option] in known else []
    else:
        near = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
    message = f"no such option: {option}" + (f"; did you mean {near[0]}?" if near else "")
    fix = f"see `{hint}`"
    if command_ctx is not None and command_ctx.command.name == "run":
        fix = (
            f"{'use ' + near[0] + ', or ' if near else ''}if {option} is the program's own option, put it "
            f"after `--`: tpuctl run SCRIPT [tpuctl options] -- {option} ..."
        )
    return UsageError(message, field=str(option), value=str(option), fix=fix)


#: Flags of gcloud and SkyPilot that people type, and the tpuctl flag of the same meaning: suggested
#: instead of the nearest spelling (which can mean something else: --accelerator is closer to
#: --capacity-type's letters than to --type), where the command has it.
OTHER_TOOLS_NAMES: dict[str, str] = {
    "--accelerator": "--type",
    "--accelerators": "--type",
    "--gpus": "--type",
    "--use-spot": "--spot",
    "--reservation": "--reserved",
    "--valid-until-duration": "--valid-for",
    "--node-count": "--slices",
    "--labels": "--label",
    "--version": "--runtime-version",
    "--detach-run": "--detach",
    "--zones": "--zone",
    "--network-tags": "--tags",
    "--subnet": "--subnetwork",
}


def command_options(command: Any) -> list[str]:
    """Every option name ``command`` takes (its long and short forms, both sides of a --x/--no-x flag)."""
    names = {
        name
        for param in command.params
        if getattr(param, "param_type_name", "") == "option"
        for name in (*param.opts, *getattr(param, "secondary_opts", ()))
    }
    return sorted(names)


def _is_framework_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__)


def _param_name(exc: BaseException) -> str | None:
    """The argument (its metavar, e.g. TYPE) or option (its long flag) a framework error is about.
    Read by attribute: the classes differ between click and the click that typer 0.29+ vendors."""
    param = getattr(exc, "param", None)
    if param is None:
        option = getattr(exc, "option_name", None)  # an unknown option
        return str(option) if option else None
    if getattr(param, "param_type_name", None) == "argument":
        name = getattr(param, "metavar", None) or getattr(param, "name", None)
        return str(name).strip("[]. ").upper() if name else None
    opts = [str(o) for o in getattr(param, "opts", []) or []]
    return max(opts, key=len) if opts else None


def _output_from_argv(argv: list[str]) -> Output:
    # The command did not get as far as choosing its output: read -o from the arguments, else the
    # environment, so an early error is still one JSON document when JSON was asked for.
    env = os.environ.get("TPUCTL_OUTPUT")
    fmt = env if env in OUTPUT_FORMATS else "table"
    for i, arg in enumerate(argv):
        if arg in ("-o", "--output") and i + 1 < len(argv) and argv[i + 1] in OUTPUT_FORMATS:
            fmt = argv[i + 1]
    return Output(fmt=fmt)
