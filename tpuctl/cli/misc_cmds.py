"""`tpuctl quota` and `tpuctl doctor`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tpuctl.cli.context import make_output, session
from tpuctl.cli.options import OutputOpt


def register(app: typer.Typer) -> None:
    app.command("quota")(quota)
    app.command("doctor")(doctor)


def quota(
    ctx: typer.Context,
    all_: Annotated[
        bool, typer.Option("--all", help="Also list quotas with nothing in use and a zero limit.")
    ] = False,
    output: OutputOpt = None,
) -> None:
    """TPU quota limits (Cloud Quotas) against what the existing slices use, per zone and region."""
    from tpuctl.services.quota import QuotaBook

    out = make_output(ctx, output)
    with session(ctx, out) as sess:
        book = QuotaBook.from_cloud(sess.cloud, sess.catalog)
    uses = [u for u in book.all_uses() if all_ or u.in_use or u.limit != 0]

    def limit_text(limit: int | None) -> str | int:
        return "unknown" if limit is None else "unlimited" if limit < 0 else limit

    out.rows(
        "quota",
        ("QUOTA", "LOCATION", "LIMIT", "IN USE", "AVAILABLE", "UNIT", "HELD BY PREEMPTED"),
        (
            (
                u.quota_id,
                u.location,
                limit_text(u.limit),
                u.in_use,
                limit_text(u.limit) if u.available is None else u.available,
                u.unit,
                u.preempted_holding or "",
            )
            for u in uses
        ),
        key="quotas",
        records=[u.to_dict() for u in uses],
    )


def doctor(ctx: typer.Context, output: OutputOpt = None) -> int:
    """Check the setup: backend, credentials, project, API reachable, quotas readable, state dir."""
    from tpuctl.errors import TpuctlError

    out = make_output(ctx, output)
    checks: list[dict[str, Any]] = []

    def check(name: str, fn: Any) -> Any:
        try:
            detail = fn()
            checks.append({"check": name, "ok": True, "detail": str(detail)})
            return detail
        except TpuctlError as exc:
            checks.append({"check": name, "ok": False, "detail": exc.message, "fix": exc.fix})
            return None

    with session(ctx, out) as sess:
        check("backend", lambda: f"{sess.backend.name} at {sess.cloud.endpoint}")
        check("project", lambda: sess.project)
        check("credentials", lambda: "anonymous (simulator)" if sess.backend.name == "sim" else "ADC")
        check("api reachable", lambda: f"{len(sess.cloud.list_zones())} zones listed")
        check("quotas readable", lambda: f"{len(sess.cloud.quota_limits())} quota limits")
        check("state dir", lambda: _state_dir_check(sess.state_dir))
        check("ledger", lambda: sess.ledger.integrity_check())
    ok = all(c["ok"] for c in checks)
    out.rows(
        "doctor",
        ("CHECK", "OK", "DETAIL"),
        ((c["check"], "ok" if c["ok"] else "FAIL", c["detail"]) for c in checks),
        key="checks",
        records=checks,
        extra={"ok": ok},
    )
    return 0 if ok else 1


def _state_dir_check(path: Any) -> str:
    from tpuctl.errors import TpuctlError

    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise TpuctlError(f"state dir {path} is readable by others (mode {mode:o})", fix=f"chmod 700 {path}")
    return f"{path} (mode {mode:o})"
