"""`tpuctl run --slices N`: N slices of one multislice queued resource, joined into one JAX job.

The plan (every slice, its price, each host's slice id), bad input, an unmodified psum over 2 x v5e-16
(8 processes, 32 devices), and the LM example preempted on one slice: the whole set is re-placed, the
job restores from the bucket and finishes, and the run's record and cost say which slice went."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from recovery_helpers import (
    HOST_XLA_ENV,
    LM_ARGS,
    WORLD,
    Chaos,
    Preempt,
    events_of,
    serve_for_jax_runs,
)

from tpuctl.sim import SimAdminClient
from tpuctl.sim.admin import NodeStatus
from tpuctl.testing.cli import Cli

V5E_ZONE = "us-central1-a"

#: An unmodified program: jax.distributed.initialize() with no arguments, a psum of ones over every
#: device of the job, and the slice the worker contract says this host is in.
PSUM = """\
import os
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.distributed.initialize()
mesh = Mesh(np.asarray(jax.devices()), ("i",))
ones = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("i")), np.ones(jax.local_device_count(), np.float32)
)
total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(jnp.sum(x), "i"), mesh=mesh, in_specs=P("i"),
                              out_specs=P()))(ones)
print("RESULT", jax.process_index(), jax.process_count(), jax.device_count(),
      float(total.addressable_data(0)), os.environ["TPUCTL_SLICE_ID"], os.environ["TPUCTL_NUM_SLICES"],
      flush=True)
"""


@pytest.fixture
def admin(
    serve_sim: Callable[..., SimAdminClient], state_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> SimAdminClient:
    return serve_for_jax_runs(
        serve_sim, WORLD, state_dir=state_dir, jax_cache=tmp_path / "jax-cache", monkeypatch=monkeypatch
    )


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user" / "prog.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_dry_run_plans_one_multislice_request_every_slice_its_price_and_each_hosts_slice(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    script = _script(tmp_path, "print('hi')\n")
    plan = cli(
        "run", str(script), "--type", "v5e-16", "--slices", "2", "--spot", "--zone", V5E_ZONE,
        "--dry-run", "-o", "json",
    ).json["plan"]  # fmt: skip
    target = plan["target"]
    assert (target["slices"], target["hosts"], target["hosts_per_slice"]) == (2, 8, 4)
    name = target["pod"]
    assert name == plan["run_id"]  # a run's slices are named after it
    assert target["slice_names"] == [f"{name}-0", f"{name}-1"]
    create = target["create"]
    (request,) = create["requests"]
    assert request["method"] == "POST" and "/queuedResources" in request["url"]
    (node_spec,) = request["body"]["tpu"]["nodeSpec"]
    assert node_spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": name}
    total = create["chosen"]["price_per_hour"]
    assert total > 0 and target["slice_price_per_hour"] == pytest.approx(total / 2)
    hosts = plan["hosts"]
    assert [h["worker"] for h in hosts] == list(range(8))
    for h in hosts:
        env = h["env"]
        assert env["TPUCTL_WORKER_ID"] == str(h["worker"]) and env["TPUCTL_NUM_WORKERS"] == "8"
        assert env["TPUCTL_SLICE_ID"] == str(h["worker"] // 4) and env["TPUCTL_NUM_SLICES"] == "2"
    # Slice 1's hosts are placeholders of slice 1's node, numbered on from slice 0's.
    assert hosts[4]["where"].startswith("tpuctl@<worker-4 address>")
    # Nothing was created.
    assert admin.status()["nodes"] == []
    table = cli("run", str(script), "--type", "v5e-16", "--slices", "2", "--spot", "--zone", V5E_ZONE,
                "--dry-run")  # fmt: skip
    assert table.code == 0, table.stderr
    assert "2 slices x v5litepod-16" in table.stdout and "8 hosts in all" in table.stdout
    # (A plan names a new request each time: the names differ from the first plan's.)
    assert re.search(r"slices: (\S+)-0, \1-1$", table.stdout, re.MULTILINE), table.stdout
    assert re.search(r"estimated price: [\d.]+ USD/h \([\d.]+ USD/h per slice\)", table.stdout), table.stdout


def test_a_run_on_a_multislice_made_by_pod_create_spans_every_slice_of_it(
    admin: SimAdminClient, cli: Cli, tmp_path: Path
) -> None:
    created = cli(
        "pod", "create", "v5e-16", "--slices", "2", "--zone", V5E_ZONE, "--name", "ms", "-o", "json"
    )
    assert created.code == 0, created.stderr
    script = _script(tmp_path, "print('hi')\n")
    plan = cli("run", str(script), "--pod", "ms", "--dry-run", "-o", "json").json["plan"]
    target = plan["target"]
    assert target["existing"] is True and target["pod"] == "ms" and target["slice_names"] == ["ms-0", "ms-1"]
    assert [h["env"]["TPUCTL_SLICE_ID"] for h in plan["hosts"]] == ["0"] * 4 + ["1"] * 4
    # Slice 1's hosts are its own node's addresses, after slice 0's.
    addresses = {n["name"]: n for n in admin.status()["nodes"]}
    assert set(addresses) == {"ms-0", "ms-1"}
    wrong = cli("run", str(script), "--pod", "ms", "--slices", "3", "--dry-run", "-o", "json")
    assert wrong.code == 2 and wrong.json["field"] == "--slices", wrong.stdout


@pytest.mark.parametrize(
    ("argv", "field", "says"),
    [
        (("--type", "v5e-16", "--slices", "1"), "--slices", "drop --slices to run on one slice"),
        (("--type", "v5e-16", "--slices", "two"), "--slices", "e.g. --slices 2"),
        (("--type", "v3-8", "--slices", "2"), "--slices", "Cloud TPU Multislice supports"),
    ],
)
def test_bad_slices_are_exit_2_naming_the_option_and_the_fix(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, argv: tuple[str, ...], field: str, says: str
) -> None:
    script = _script(tmp_path, "print('hi')\n")
    result = cli("run", str(script), *argv, "--spot", "--dry-run", "-o", "json")
    assert result.code == 2, result.stdout + result.stderr
    error = result.json
    assert error["field"] == field
    assert says in error["message"] + error["fix"]
    assert admin.status()["nodes"] == []


def test_more_slices_than_any_zone_has_quota_for_is_refused_naming_the_limit(
    serve_sim: Callable[..., SimAdminClient], cli: Cli, tmp_path: Path
) -> None:
    world: dict[str, Any] = {
        **WORLD,
        "quotas": {
            "default": {"on_demand": {"zone": 32, "region": 32}, "preemptible": {"zone": 32, "region": 32}}
        },
    }
    admin = serve_sim(world)
    script = _script(tmp_path, "print('hi')\n")
    result = cli("run", str(script), "--type", "v5e-16", "--slices", "3", "--spot", "--zone", V5E_ZONE,
                 "--dry-run", "-o", "json")  # fmt: skip
    assert result.code == 4, result.stdout + result.stderr
    message = result.json["message"]
    assert "48" in message and "32" in message, message  # 3 x 16 chips asked, 32 allowed
    assert admin.status()["nodes"] == []


@pytest.mark.parametrize(
    ("accelerator", "zone", "hosts", "chips"),
    [
        # The default suite's: two one-host slices, two hosts setting up the runtime. Several hosts in
        # each of two slices joined into one JAX job is tests/sim/test_multislice_vms.py's (8 VMs).
        ("v4-8", "us-central2-b", 1, 4),
        # 4 hosts (about 25 s of a loaded 2-core machine), and the acceptance shape: 8 hosts, each setting
        # up the runtime on its own disk (about a minute), so with --slow.
        pytest.param("v4-16", "us-central2-b", 2, 4, marks=pytest.mark.slow),
        pytest.param("v5e-16", V5E_ZONE, 4, 4, marks=pytest.mark.slow),
    ],
)
def test_an_unmodified_psum_joins_every_host_and_device_of_two_slices(
    admin: SimAdminClient, cli: Cli, tmp_path: Path, accelerator: str, zone: str, hosts: int, chips: int
) -> None:
    script = _script(tmp_path, PSUM)
    result = cli("run", str(script), "--type", accelerator, "--slices", "2", "--spot", "--zone", zone)
    assert result.code == 0, result.stderr[-4000:]
    rows = sorted(
        re.findall(r"^w(\d+) \| RESULT (.*)$", result.stdout, re.MULTILINE), key=lambda r: int(r[0])
    )
    # JAX numbers processes slice by slice: worker w is process w, in slice w // hosts. On 2 x v5e-16:
    # 8 processes, 32 devices, a psum of 32.0 on every host.
    processes, devices = 2 * hosts, 2 * hosts * chips
    expected = [
        (str(w), f"{w} {processes} {devices} {float(devices)} {w // hosts} 2") for w in range(processes)
    ]
    assert rows == expected, result.stdout[-3000:]
    assert admin.status()["nodes"] == []  # both slices went with the run
    # Each slice is a pod of the run in the ledger, billed to it.
    report = cli("cost", "report", "--group-by", "run", "-o", "json").json
    (group,) = report["groups"]
    assert group["slices"] == 2, group


def _lm_args(batch: int) -> list[str]:
    """The tiny LM with one example per device of the job (``batch`` devices)."""
    at = LM_ARGS.index("--batch") + 1
    return [*LM_ARGS[:at], str(batch), *LM_ARGS[at + 1 :]]


def _second_slice(nodes: list[NodeStatus]) -> NodeStatus | None:
    """Slice 1 of the run's multislice, once both slices are READY."""
    ready = sorted((n for n in nodes if n.get("state") == "READY"), key=lambda n: str(n["name"]))
    return ready[1] if len(ready) == 2 else None


# 70 to 90 s on 2 cores for 2 x v4-16 (4 JAX hosts), about twice that for the acceptance's 2 x v5e-16
# (8): two placements, every host set up twice, a checkpoint through the bucket.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("accelerator", "zone", "devices"), [("v4-16", "us-central2-b", 16), ("v5e-16", V5E_ZONE, 32)]
)
def test_the_lm_on_two_slices_recovers_from_one_slices_preemption_and_says_which(
    admin: SimAdminClient, cli: Cli, state_dir: Path, accelerator: str, zone: str, devices: int
) -> None:
    chaos = Chaos(admin, state_dir, [Preempt(1, 6, notice=True)], pick=_second_slice).start()
    try:
        result = cli(
            "run", "--example", "lm", "--type", accelerator, "--slices", "2", "--spot", "--zone", zone,
            "--checkpoint-every", "4", *HOST_XLA_ENV, "-o", "json", "--", *_lm_args(devices),
        )  # fmt: skip
    finally:
        chaos.join(check=False)
    assert result.code == 0, result.stderr[-4000:]
    chaos.check()
    run_id = result.json["run"]["run_id"]
    log = state_dir / "runs" / run_id / "worker-0.log"
    events = events_of(log)
    losses = [float(e["loss"]) for e in events if e["event"] == "step" and "loss" in e]
    assert losses and losses[-1] < losses[0], losses
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] is not None and starts[1]["restored"] > 0
    assert admin.status()["nodes"] == []
    described = cli("runs", "describe", run_id, "-o", "json").json["run"]
    (preemption,) = described["recovery"]["preemptions"]
    lost = chaos.plan[0].node
    assert lost is not None and preemption["lost_slices"] == [lost]
    first = preemption["pod"]
    assert preemption["replaced_slices"] == [f"{first}-0", f"{first}-1"]
    assert preemption["new_pod"] != first
    report = cli("cost", "report", "--group-by", "run", "-o", "json").json
    (group,) = report["groups"]
    assert group["slices"] == 4, group  # both slices of the first set and of the re-placed one
    # The recomputed work is counted (the program reports its steps), and so is what the preemption
    # wasted: the steps redone after the restore, at the price of every slice of the set.
    assert "steps_reported" not in group and group["recomputed_usd"] is not None
    recomputed = described["recovery"]["steps_recomputed"]
    assert (group["recomputed_usd"] > 0) == (recomputed > 0), (group, recomputed)
    assert group["waste_usd"] is not None and group["waste_usd"] >= group["recomputed_usd"]
