"""Running an experiment's runs in several worker processes at once (``lmembed experiment --workers N``).

Each worker is a fresh (spawned) process that owns one :class:`Slot`: a device and a thread count. On the CPU the
cores are split evenly between the workers (a small model's matrix products use several threads poorly, so
separate runs can keep the cores busier than one run with all the threads); on GPUs each worker takes its own
device, round robin. A worker builds the evaluation suite once and runs whole runs (training,
then scoring: :func:`~lmembed.experiments.execute.execute_run`). Every run reaches the disk exactly as in one
process (``run.json`` written last, atomically), so ``--resume`` does not care how its runs were made, and a run's
key does not include the device.

A run starts once what it reads exists: an arm scoring another arm's stage (``model_from``) waits for that run of
its seed, and the seeds of a recipe arm that prepares data (mined negatives, converted sets; shared by its seeds)
wait until one of them has finished, instead of preparing the same files side by side.

If a run fails, no further run is started; the runs already going are finished and kept, and the error is raised.
An interrupt (Ctrl-C, or SIGTERM, which raises :class:`KeyboardInterrupt` while the workers run) stops the workers
at once (:func:`worker_pool`): their unfinished runs have no ``run.json`` and start over on ``--resume``. Left
running, they would write on into the run folders after this process has gone, beside a new one resuming.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.errors import sigterm_interrupts
from lmembed.evaluation.base import Task
from lmembed.experiments.execute import ExperimentError, RunInUseError, execute_run
from lmembed.experiments.plan import PlannedRun, source_run
from lmembed.experiments.scoring import build_suite
from lmembed.experiments.spec import ExperimentSpec

Progress = Callable[[str], None]
Finished = Callable[[PlannedRun, dict[str, Any]], None]
Skipped = Callable[[PlannedRun, str], None]


@dataclass(frozen=True)
class Slot:
    """What one worker process runs on."""

    device: str
    threads: int


def worker_slots(device: str, workers: int, *, cores: int | None = None, gpus: int | None = None) -> list[Slot]:
    """One slot per worker: GPUs round robin when the experiment's ``device`` is (or, for ``auto``, finds) CUDA,
    else the CPU; either way the ``cores`` (default: this machine's) split evenly, at least one thread each."""
    if workers < 1:
        raise ValueError(f"workers: at least 1, got {workers}")
    threads = max(1, (cores or os.cpu_count() or 1) // workers)
    if device.startswith("cuda") or device == "auto":
        if gpus is None:
            import torch  # lazy: torch loads only when a run needs it

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus:
            return [Slot(f"cuda:{i % gpus}", threads) for i in range(workers)]
        if device != "auto":
            raise ValueError("device cuda: no CUDA GPU is visible to this process")
    return [Slot("cpu", threads) for _ in range(workers)]


# ------------------------------------------------------------------------------------------- in the workers
_slot: Slot | None = None
_suite: list[Task] | None = None


def _start_worker(slots: Any) -> None:
    """Take a slot and limit this process's threads to it (before torch is imported by the first run)."""
    global _slot
    _slot = slots.get()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(_slot.threads)
    import torch

    torch.set_num_threads(_slot.threads)


def _run_in_worker(spec: ExperimentSpec, run: PlannedRun, output: Path) -> dict[str, Any]:
    global _suite
    if _suite is None:
        _suite = build_suite(spec.evaluation)
    assert _slot is not None, "the worker was started without a slot"
    return execute_run(dataclasses.replace(spec, device=_slot.device), run, _suite, output)


# ------------------------------------------------------------------------------------------- the pool
@contextlib.contextmanager
def worker_pool(
    workers: int, context: Any, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()
) -> Iterator[ProcessPoolExecutor]:
    """A process pool that, when the block ends in an exception or interrupt, ends its workers at once instead of
    waiting for their running tasks (``ProcessPoolExecutor``'s own exit waits). In the main thread SIGTERM raises
    :class:`KeyboardInterrupt` inside the block (by default it would end this process alone, the workers going on)."""
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=initializer, initargs=initargs)
    try:
        with sigterm_interrupts():
            yield pool
    except BaseException:
        processes = list((getattr(pool, "_processes", None) or {}).values())  # 3.11-3.13: no public call
        for process in processes:
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(5)
        for process in processes:  # one that outlives SIGTERM (busy in native code, or a handler of its own)
            if process.is_alive():
                process.kill()
                process.join(60)  # SIGKILL cannot be caught: this returns once it is gone (slower when loaded)
        raise
    else:
        pool.shutdown(wait=True)


# ------------------------------------------------------------------------------------------- the scheduler
def _prepares(run: PlannedRun) -> bool:
    return bool(run.arm.recipe and run.arm.recipe.get("prepare"))


def ready(
    spec: ExperimentSpec,
    run: PlannedRun,
    output: Path,
    running: Iterable[PlannedRun],
    finished_arms: set[str],
) -> bool:
    """Whether ``run`` can start now (see the module docstring)."""
    if run.arm.model_from is not None and not source_run(spec, run, output).finished:
        return False
    if _prepares(run) and run.arm.name not in finished_arms:
        return not any(other.arm.name == run.arm.name for other in running)
    return True


def run_parallel(
    spec: ExperimentSpec,
    pending: Sequence[PlannedRun],
    output: Path,
    workers: int,
    *,
    finished_arms: set[str],
    on_finished: Finished,
    on_skipped: Skipped,
    say: Progress,
) -> None:
    """Run ``pending`` (in plan order, as their inputs allow) on ``workers`` processes; ``on_finished`` gets each
    run's record as it arrives. ``finished_arms``: arms with a run finished before (their prepared data exists)."""
    try:
        slots = worker_slots(spec.device, workers)
    except ValueError as exc:
        raise ExperimentError(f"--workers {workers}: {exc}") from exc
    say(f"{workers} workers: " + ", ".join(f"{s.device} ({s.threads} thread{'s' * (s.threads > 1)})" for s in slots))
    context = multiprocessing.get_context("spawn")  # no CUDA state or thread pools carried over from this process
    queue = context.Queue()
    for slot in slots:
        queue.put(slot)
    number = {run.id: n for n, run in enumerate(pending, start=1)}
    waiting, running = list(pending), {}
    failure: tuple[PlannedRun, Exception] | None = None
    done_arms = set(finished_arms)
    with worker_pool(workers, context, _start_worker, (queue,)) as pool:
        while waiting or running:
            if failure is None:
                for run in list(waiting):
                    if len(running) >= workers:
                        break
                    if ready(spec, run, output, running.values(), done_arms):
                        waiting.remove(run)
                        kind = "training + evaluation" if run.arm.trains else "evaluation"
                        say(f"[{number[run.id]}/{len(pending)}] {run.id}: {kind} (started)")
                        running[pool.submit(_run_in_worker, spec, run, output)] = run
            if not running:
                if waiting and failure is None:
                    blocked = ", ".join(run.id for run in waiting)
                    raise ExperimentError(f"runs that can never start (what they read did not finish): {blocked}")
                break
            finished: set[Future] = wait(running, return_when=FIRST_COMPLETED)[0]
            for future in finished:
                run = running.pop(future)
                try:
                    record = future.result()
                except RunInUseError as exc:  # another process runs it: left alone, listed as not run
                    on_skipped(run, str(exc))
                    continue
                except Exception as exc:  # reported after the runs still going have finished
                    say(f"    {run.id}: failed: {exc}")
                    failure = failure or (run, exc)
                    continue
                done_arms.add(run.arm.name)
                on_finished(run, record)
    if failure is not None:
        run, exc = failure
        raise ExperimentError(
            f"run {run.id} failed in a worker: {exc}; the runs that finished are kept (--resume continues)"
        ) from exc
