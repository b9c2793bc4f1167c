"""Run the batch's per-model tasks on a Ray cluster (the optional `[ray]` extra).

Each Ray task runs the same child process as a local batch, with the same caps, and
writes into OUT_ROOT, which every node must therefore see at the same path (a shared file
system). A task whose worker dies is retried once by Ray, then recorded as crashed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from onnx2tf_alt.batching.worker import Task, run_task
from onnx2tf_alt.errors import InputError

INSTALL_HINT = "pip install onnx2tf_alt[ray]"


class RayMissingError(InputError):
    """--ray was asked for but Ray is not installed."""


def run_on_ray(tasks: list[Task], address: str, finished: Callable[[dict], None],
               jobs: int | None = None) -> None:
    """Run `tasks` as Ray tasks (at most `jobs` at a time when given), calling `finished`
    with each ChildResult dict as it arrives. `address`: a cluster address, "auto" (the
    cluster this machine belongs to) or "local" (start one here)."""
    try:
        import ray
    except ImportError as exc:
        raise RayMissingError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from exc
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "local" else address,
                     include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(f"--ray {address}: no Ray cluster there ({exc}). Start one "
                             "(`ray start --head`) or pass --ray local.") from exc
    remote = ray.remote(num_cpus=1, max_retries=1)(run_task)
    waiting = [asdict(t) for t in tasks]
    running: dict = {}
    while waiting or running:
        while waiting and (jobs is None or len(running) < jobs):
            task = waiting.pop(0)
            running[remote.remote(task)] = task
        [ref], _ = ray.wait(list(running), num_returns=1)
        task = running.pop(ref)
        try:
            finished(ray.get(ref))
        except ray.exceptions.RayError as exc:
            finished(lost(task["name"], f"Ray worker died twice ({type(exc).__name__})"))


def lost(name: str, why: str) -> dict:
    """The ChildResult of a task whose worker was lost."""
    return {"name": name, "exit_code": None, "stopped_for": None, "wall_s": None,
            "peak_rss_mb": None, "lost": why}
