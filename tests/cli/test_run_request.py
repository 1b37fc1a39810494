"""`tpuctl run JOB.yaml`: a job file and the flags beside it through one typed request. Bad files are
exit 2 naming the line and key before anything is contacted; flags override (and the plan says so);
public SkyPilot TPU tasks plan (or are refused by field); one job runs end to end on the served simulator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim import SimAdminClient
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli
from tpuctl.testing.ports import unused_port

SKYPILOT = Path(__file__).resolve().parents[1] / "jobs" / "skypilot"

JOB = """\
name: lm
resources:
  accelerators: {tpu-v5e-16, tpu-v6e-8}
  use_spot: true
envs:
  LR: "3e-4"
run: python3 -m tpuctl.runtime.examples.lm_train --steps 5 "$@"
bucket: tpuctl-sim
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- bad files: exit 2 before anything is contacted ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("resources:\n  accelerators: tpu-v6e-8\n  use_spott: true\nrun: x\n",
         "job.yaml:3: resources.use_spott: unknown key; did you mean use_spot?"),
        ("resources:\n  accelerators: tpu-v6e-8\nslices: [2]\nrun: x\n",
         "job.yaml:3: slices: input should be"),
        ("resources:\n  accelerators: tpu-v6z-8\nrun: x\n",
         "job.yaml:2: resources.accelerators: unknown accelerator generation"),
        ("resources:\n  accelerators: tpu-v2-8\nnum_nodes: 2\nrun: x\n",
         "job.yaml:3: num_nodes: not supported"),
    ],
)  # fmt: skip
def test_a_bad_job_file_is_exit_2_naming_line_and_key_before_anything_is_contacted(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, text: str, where: str
) -> None:
    # A simulator URL nothing listens on: contacting it would fail otherwise (unreachable, not exit 2).
    monkeypatch.setenv("TPUCTL_SIM_URL", f"http://127.0.0.1:{unused_port()}")
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "job.yaml", text)
    result = cli("run", "job.yaml", "-o", "json")
    assert result.code == 2, result.stderr
    assert result.json["message"].startswith(where), result.json["message"]
    assert result.json["error"] == "job_file" and result.json["path"] == "job.yaml"


# --- flags beside a file ----------------------------------------------------------------------------------


def test_type_flag_overrides_the_file_and_the_plan_says_where_each_value_came_from(
    tmp_path: Path, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "job.yaml", JOB)
    result = sim_cli("run", "job.yaml", "--type", "v5e-8", "--env", "LR=1e-3", "--env", "B=2", "--label",
                     "team=ml", "--dry-run", "-o", "json", "--", "--lr", "3")  # fmt: skip
    assert result.code == 0, result.stderr
    plan = result.json["plan"]
    assert plan["target"]["accelerator_type"] == "v5litepod-8" and plan["target"]["capacity"] == "spot"
    assert "accelerator_types" not in plan  # --type replaced the file's set with one type
    sources = plan["sources"]
    assert sources["accelerator_type"] == "flag --type (over job.yaml:3 resources.accelerators)"
    assert sources["spot"] == "job.yaml:4 resources.use_spot"
    assert sources["env"] == "flag --env (added to job.yaml:5 envs)"
    host = plan["hosts"][0]
    assert (host["env"]["LR"], host["env"]["B"]) == ("1e-3", "2")  # the flag wins on the same key
    assert host["argv"][-3:] == ['python3 -m tpuctl.runtime.examples.lm_train --steps 5 "$@"', "--lr", "3"]
    assert host["argv"][1] == "-c"  # the shell command, started by the run's interpreter


def test_several_types_and_secrets_plan_with_the_secret_shown_only_as_secret(
    tmp_path: Path, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "job.yaml", JOB + "secrets:\n  HF_TOKEN: null\n")
    env = {"HF_TOKEN": "hf_s3cr3t"}
    planned = sim_cli("run", "job.yaml", "--dry-run", "-o", "json", env=env)
    assert planned.code == 0, planned.stderr
    plan = planned.json["plan"]
    assert plan["accelerator_types"] == ["v5e-16", "v6e-8"] and plan["type_preference"] == "cheapest"
    assert plan["secrets"] == {"HF_TOKEN": "<secret>"}
    assert all(host["env"]["HF_TOKEN"] == "<secret>" for host in plan["hosts"])
    assert "hf_s3cr3t" not in planned.stdout + planned.stderr
    human = sim_cli("run", "job.yaml", "--dry-run", env=env)
    assert human.code == 0 and "secret HF_TOKEN=<secret>" in human.stdout
    assert "hf_s3cr3t" not in human.stdout + human.stderr
    # Unset in the submitting environment and not given: exit 2 naming it, before anything is made.
    unset = sim_cli("run", "job.yaml", "--dry-run", "-o", "json")
    assert unset.code == 2 and "secret HF_TOKEN has no value" in unset.json["message"]
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []


# --- public SkyPilot TPU tasks ---------------------------------------------------------------------------

#: file -> (the API's type, capacity, the new slice's runtime version, a line of its run:, its secrets).
PLANNED: dict[str, tuple[str, str, str, str, dict[str, str] | None]] = {
    "tpuvm_mnist.yaml": ("v2-8", "on-demand", "tpu-ubuntu2204-base", "python3 main.py", None),
    "tpu_app.yaml": ("v2-8", "on-demand", "tpu-ubuntu2204-base", "python -u run_tpu.py", None),
    "tpuvm_pod_mnist.yml": ("v2-32", "on-demand", "tpu-vm-base", "python3 main.py", None),
    "train-llama3-8b.yaml": ("v6e-8", "on-demand", "v2-alpha-tpuv6e", "run_clm.py", {"HF_TOKEN": "<secret>"}),
}


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_skypilot_tasks_tpuctl_supports_plan_as_written(
    name: str, tmp_path: Path, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # their workdirs are relative to where the task is launched, as SkyPilot's
    (tmp_path / "examples" / "tpu" / "tpu_app_code").mkdir(parents=True)
    accelerator, capacity, runtime, command, secrets = PLANNED[name]
    result = sim_cli("run", str(SKYPILOT / name), "--dry-run", "-o", "json", env={"HF_TOKEN": "t"})
    assert result.code == 0, result.stderr
    plan: dict[str, Any] = result.json["plan"]
    target = plan["target"]
    assert (target["accelerator_type"], target["capacity"]) == (accelerator, capacity)
    assert target["create"]["request"]["runtime_version"] == runtime
    assert target["zone"] is not None
    assert command in plan["command"] and plan["setup"]["commands"]  # setup: as --setup, run: on each host
    assert all(command in host["argv"][3] for host in plan["hosts"])
    assert plan.get("secrets") == secrets


@pytest.mark.parametrize(
    ("name", "field"),
    [("tpuvm_multinode.yml", "num_nodes"), ("tpu_node_mnist.yaml", "resources.instance_type")],
)
def test_skypilot_tasks_needing_what_tpuctl_lacks_are_refused_naming_the_field(
    name: str, field: str, sim_cli: InProcessCli
) -> None:
    result = sim_cli("run", str(SKYPILOT / name), "--dry-run", "-o", "json")
    assert result.code == 2
    assert result.json["key"] == field and "not supported by tpuctl" in result.json["message"]


# --- end to end ------------------------------------------------------------------------------------------

WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {"us-central1-a": {"v5e": {"on_demand": 64}}},
    "quotas": {"default": {"on_demand": {"zone": -1, "region": -1}}},
    "latency": {"base_ms": 0, "jitter_ms": 0},
}


def test_a_job_files_shell_command_runs_in_the_workdir_with_args_and_its_exit_status(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient], cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_sim(WORLD)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "proj" / "data.txt", "from-the-workdir\n")
    write(
        tmp_path / "job.yaml",
        "resources: {accelerators: tpu-v5litepod-8}\nworkdir: proj\nruntime_deps: false\n"
        "envs: {GREETING: hello}\n"
        'run: echo "$GREETING $(cat data.txt) worker=$TPUCTL_WORKER_ID n=$# [$1] [$2]"; exit 3\n',
    )
    result = cli("run", "job.yaml", "--", "a b", "c")
    assert result.code == 8, result.stderr  # a host failed: the run failed with its status
    assert "hello from-the-workdir worker=0 n=2 [a b] [c]" in result.stdout
    assert "host 0 exited with status 3" in result.stderr
    run_id = re.search(r"run (run-[0-9a-z-]+) failed", result.stderr)
    assert run_id is not None
    record = cli("runs", "describe", run_id.group(1), "-o", "json").json["run"]
    assert record["exit_code"] == 3 and record["program"].startswith("sh: echo")


@pytest.mark.slow
def test_a_gs_file_mount_is_on_every_host_before_setup_and_run(
    tmp_path: Path, serve_sim: Callable[..., SimAdminClient], cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow: the runtime's environment is installed on the hosts (its gcsfs does the copy)."""
    serve_sim(WORLD)
    monkeypatch.chdir(tmp_path)
    assert cli("pod", "create", "v5e-8", "--zone", "us-central1-a", "--name", "fm").code == 0
    put = "python3 -c \"import gcsfs; gcsfs.GCSFileSystem().pipe('gs://tpuctl-sim/in/data.txt', b'mounted')\""
    write(tmp_path / "put.yaml", f"resources: {{pod: fm}}\nrun: {json.dumps(put)}\n")
    stored = cli("run", "put.yaml")
    assert stored.code == 0, stored.stderr
    write(
        tmp_path / "job.yaml",
        "resources: {pod: fm}\nfile_mounts:\n  /tmp/fm/data.txt: gs://tpuctl-sim/in/data.txt\n"
        'setup: test -f /tmp/fm/data.txt\nrun: echo "got $(cat /tmp/fm/data.txt)"\n',
    )
    result = cli("run", "job.yaml")
    assert result.code == 0, result.stderr
    assert "got mounted" in result.stdout
