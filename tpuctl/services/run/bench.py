"""``tpuctl bench step``'s pieces: the bundled step program, the observer that keeps its result line, and
the figures made from it. The run itself is an ordinary run, supervised as ``tpuctl run``'s are
(``Runs.start``), with recovery off (``RecoveryPolicy.off``): the first failure or preemption ends it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuctl.catalog import AcceleratorType
from tpuctl.services.run.model import LaunchObserver, PhaseUpdate, Silent

#: The line the bench program's host 0 prints (tpuctl/hosts/programs/bench_step.py).
BENCH_STEP_PREFIX = "TPUCTL_BENCH_STEP "


def bench_step_program() -> Path:
    """The bench program shipped as the run's script (its directory is the bundle's workdir)."""
    from tpuctl.hosts import programs

    return Path(programs.__file__).resolve().parent / "bench_step.py"


class BenchCollector:
    """An observer that passes everything on and keeps host 0's result line."""

    def __init__(self, inner: LaunchObserver | None = None) -> None:
        self._inner: LaunchObserver = inner or Silent()
        self.result: dict[str, Any] | None = None

    def line(self, worker: int, text: str) -> None:
        if worker == 0 and text.startswith(BENCH_STEP_PREFIX):
            self.result = json.loads(text[len(BENCH_STEP_PREFIX) :])
        self._inner.line(worker, text)

    def status(self, text: str) -> None:
        self._inner.status(text)

    def phase(self, update: PhaseUpdate) -> None:
        self._inner.phase(update)

    def detail(self, worker: int | None, text: str) -> None:
        self._inner.detail(worker, text)


@dataclass(frozen=True)
class BenchFigures:
    """What ``bench step`` reports (``-o json``: ``to_dict``). The program's own figures are as it printed
    them; None where it did not say."""

    run_id: str
    slices: int
    accelerator_type: str
    hosts: int | None
    devices: int | None
    platform: str | None  # tpu, or cpu on the simulator
    params: int | None
    global_batch: int | None
    seq_len: int | None
    compute_dtype: str | None
    step_time_s: float
    tokens_per_s: float
    achieved_tflops: float
    peak_tflops: float | None  # None: unknown (the simulator measured none)
    peak_source: str
    fraction_of_peak: float | None
    compile_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bench_step_figures(
    raw: Mapping[str, Any], accelerator: AcceleratorType, *, run_id: str, slices: int = 1
) -> BenchFigures:
    """Step time, tokens/s, achieved TFLOP/s and the fraction of peak: the catalog's peak (bf16, every
    slice) on TPU; on the simulator, the large matmul measured on the same CPU in the same run (all
    simulated hosts share that CPU, so it is the whole job's peak too)."""
    achieved = float(raw["achieved_tflops"])
    if raw.get("platform") == "tpu":
        peak: float | None = accelerator.peak_bf16_tflops * slices
        what = accelerator.friendly_name if slices == 1 else f"{slices} x {accelerator.friendly_name}"
        source = f"catalog: {what} peak bf16 ({accelerator.chips * slices} chips)"
    else:
        measured = raw.get("matmul_peak_tflops")
        peak = None if measured is None else float(measured)
        source = (
            f"measured: {raw.get('matmul_n')}^3 {raw.get('compute_dtype')} matmul on this machine's "
            f"{raw.get('platform')} in the same run"
        )
    return BenchFigures(
        run_id=run_id,
        slices=slices,
        accelerator_type=accelerator.api_name,
        hosts=raw.get("processes"),
        devices=raw.get("devices"),
        platform=raw.get("platform"),
        params=raw.get("params"),
        global_batch=raw.get("global_batch"),
        seq_len=raw.get("seq_len"),
        compute_dtype=raw.get("compute_dtype"),
        step_time_s=raw["step_time_s"],
        tokens_per_s=raw["tokens_per_s"],
        achieved_tflops=achieved,
        peak_tflops=peak,
        peak_source=source,
        fraction_of_peak=None if not peak else achieved / peak,
        compile_s=raw.get("compile_s"),
    )
