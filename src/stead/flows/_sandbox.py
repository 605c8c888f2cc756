"""Model-controlled computation off the event loop, with a deadline that is enforced (SEC4).

A tool argument chosen by the model (a JMESPath path, a regular expression, a pipeline of stages) can ask
for work that grows without bound: a path that doubles a list a hundred times, a value that shares
sub-values so that its text is exponentially long. Such work must neither stall the event loop (every other
agent and the HTTP service run on it) nor outlive its deadline. A Python thread cannot be stopped, and
CPU-bound Python code holds the interpreter lock, so the work runs in a worker *process*:

- `compute(fn, *args, deadline=...)` sends the call to an idle worker and waits for the answer in a thread
  of a small dedicated pool (the event loop only awaits); at the deadline — or when the awaiting task is
  cancelled — the worker is killed (SIGKILL) and a fresh one replaces it on the next call;
- at most `WORKERS` computations run at once (more wait their turn, their deadline running);
- each worker limits its address space to `MEMORY_LIMIT` bytes: a computation that allocates past it gets
  a `MemoryError`, reported as an error result;
- workers are forked from a fork server (a clean process started once, which imports the computations) —
  never from the serving process itself, whose threads and sockets a fork would copy.

The functions a worker may run are the ones of `stead.flows._compute`, by name.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["MEMORY_LIMIT", "WORKERS", "ComputeTimeout", "compute"]

WORKERS = 2
MEMORY_LIMIT = 2 << 30
"""Bytes of address space per worker process (RLIMIT_AS)."""
_POLL = 0.05
_MODULE = "stead.flows._compute"


class ComputeTimeout(Exception):
    """The computation did not finish within its deadline (its worker was killed)."""


class ComputeFailed(Exception):
    """The computation raised (the message says why, for the model)."""


def _serve(conn: multiprocessing.connection.Connection, memory_limit: int) -> None:  # pragma: no cover
    """A worker's loop (in the child): run each request, answer ("ok", value) or ("error", message)."""
    import importlib

    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    except (ImportError, ValueError, OSError):
        pass
    functions = importlib.import_module(_MODULE)
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer: tuple[str, Any] = ("ok", getattr(functions, fn)(*args))
        except functions.ComputeError as e:
            answer = ("error", str(e))
        except MemoryError:
            answer = ("error", "the computation needed more memory than it may use")
        except RecursionError:
            answer = ("error", "the data is too deeply nested")
        except Exception as e:
            answer = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(answer)
        except MemoryError:
            conn.send(("error", "the answer needed more memory than it may use"))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        parent, child = ctx.Pipe()
        self.conn: multiprocessing.connection.Connection = parent
        self.process = ctx.Process(target=_serve, args=(child, MEMORY_LIMIT), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([_MODULE])
        return ctx
    return multiprocessing.get_context("spawn")


class _Pool:
    """`WORKERS` threads, each owning at most one worker process (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0
        self._local = threading.local()

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._ctx = _context()
                self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="stead-compute")
                self._pid = os.getpid()
            return self._executor

    def _worker(self) -> _Worker:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None or not worker.process.is_alive():
            worker = self._local.worker = _Worker(self._ctx)
        return worker

    def call(self, fn: str, args: tuple[Any, ...], deadline: float, cancelled: threading.Event) -> Any:
        """In a pool thread: run `fn(*args)` in this thread's worker; kill it at `deadline` (monotonic)."""
        if time.monotonic() >= deadline or cancelled.is_set():
            raise ComputeTimeout()
        worker = self._worker()
        try:
            worker.conn.send((fn, args))
            while not worker.conn.poll(min(_POLL, max(deadline - time.monotonic(), 0))):
                if time.monotonic() >= deadline or cancelled.is_set():
                    raise ComputeTimeout()
            status, value = worker.conn.recv()
        except ComputeTimeout:
            self._local.worker = None
            worker.kill()
            raise
        except (EOFError, OSError, BrokenPipeError):
            # the worker died (its memory limit, a signal): a fresh one takes the next call
            self._local.worker = None
            worker.kill()
            raise ComputeFailed(
                "the computation's worker process ended (it may have used too much memory)"
            ) from None
        if status != "ok":
            raise ComputeFailed(value)
        return value


_POOL = _Pool()


async def compute(fn: str, *args: Any, deadline: float) -> Any:
    """`stead.flows._compute.<fn>(*args)` in a worker process, by `deadline` (a `time.monotonic()` time).
    Raises `ComputeTimeout` at the deadline (the worker is killed) and `ComputeFailed` with the reason when
    the computation failed; cancelling the awaiting task kills the worker too."""
    cancelled = threading.Event()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_POOL.executor(), _POOL.call, fn, args, deadline, cancelled)
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, also after a cancel
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancelled.set()  # the pool thread kills the worker at its next poll
        raise
