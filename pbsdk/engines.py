"""Where independent jobs run (`pbsdk dse` variants, `pbsdk conform` cases): here, in processes, or on Ray.

`run_unordered` runs ``fn(args)`` for every item and yields ``(key, result)`` as each finishes, whatever the
engine, so callers stream results into their reports the same way:

- ``local``: ``jobs`` worker processes (``jobs <= 1``: in this process, in order);
- ``ray`` (``pip install pbsdk[ray]``): one Ray task per item on the cluster at ``address``, or on a local
  Ray started for the run with ``jobs`` CPUs (and stopped after; while it starts, a process forked from
  this one runs the first item, so the seconds Ray takes to start are not idle). A task whose worker dies (killed, out of
  memory, a crashed node) is run again by Ray, up to `RAY_RETRIES` times, so no item is lost; an exception
  ``fn`` raises is not retried (it is the item's result to report, and ``fn`` is expected to return it).

``fn`` must be a module-level function (pickled by reference), its arguments and results plain data.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from pbsdk.core.errors import PbsdkError

ENGINES = ("local", "ray")
#: Times Ray runs a task again after its worker died.
RAY_RETRIES = 3


def run_unordered(fn: Callable[[Any], Any], items: Sequence[tuple[Hashable, Any]], *, engine: str = "local",
                  jobs: int = 1, address: str | None = None) -> Iterator[tuple[Hashable, Any]]:
    """``(key, fn(args))`` for each ``(key, args)`` of ``items``, as they finish (see the module docstring)."""
    if engine == "local":
        yield from _local(fn, items, jobs)
    elif engine == "ray":
        yield from _ray(fn, items, jobs, address)
    else:
        raise PbsdkError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def _local(fn: Callable[[Any], Any], items: Sequence[tuple[Hashable, Any]], jobs: int) -> Iterator[tuple[Hashable, Any]]:
    if jobs <= 1 or len(items) <= 1:
        for key, args in items:
            yield key, fn(args)
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(items))) as pool:
        futures = {pool.submit(fn, args): key for key, args in items}
        for done in concurrent.futures.as_completed(futures):
            yield futures[done], done.result()


def _ray(fn: Callable[[Any], Any], items: Sequence[tuple[Hashable, Any]], jobs: int,
         address: str | None) -> Iterator[tuple[Hashable, Any]]:
    try:
        import ray
    except ImportError:
        raise PbsdkError("--engine ray needs Ray: pip install 'pbsdk[ray]'") from None
    started = not ray.is_initialized()
    items = list(items)
    # A local Ray takes seconds to start (GCS, raylet, workers: 4-6 s on 2 cores). When there are more items
    # than its workers, the first one runs meanwhile in a process forked from this one before Ray starts
    # (so it forks no Ray threads and imports nothing again), and Ray gets the rest.
    head = [items.pop(0)] if started and not address and len(items) > max(1, jobs) else []
    fork = multiprocessing.get_context("fork")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=fork) if head else None
    early = {pool.submit(fn, args): key for key, args in head} if pool is not None else {}
    try:
        if started and address:
            # The cluster's workers import pbsdk as this process does (an editable or PYTHONPATH install
            # included) and see its settings (the cache's directory and URL).
            env = {"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("PBSDK_", "PYTHONPATH"))}}
            ray.init(address=address, runtime_env=env, log_to_driver=False)
        elif started:
            # A local Ray's workers are children of the raylet this starts, so they inherit this process's
            # environment as it is; a runtime_env would make Ray start other workers for it (~2 s).
            ray.init(num_cpus=max(1, jobs), include_dashboard=False, log_to_driver=False)
        task = ray.remote(max_retries=RAY_RETRIES, retry_exceptions=False)(fn)
        pending = {task.remote(args): key for key, args in items}
        while pending or early:
            for fut in [f for f in early if f.done()]:
                key = early.pop(fut)
                try:
                    yield key, fut.result()
                except concurrent.futures.process.BrokenProcessPool:  # the process died: Ray runs it again
                    pending[task.remote(dict(head)[key])] = key
            if pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.05 if early else None)
                for ref in done:
                    yield pending.pop(ref), ray.get(ref)
            elif early:
                concurrent.futures.wait(list(early), return_when=concurrent.futures.FIRST_COMPLETED)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if started:
            ray.shutdown()


__all__ = ["ENGINES", "RAY_RETRIES", "run_unordered"]
