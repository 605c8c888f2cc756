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
  a `MemoryError`, reported as an error result; and runs at a lower CPU priority (nice 10), so the serving
  process comes first when CPUs are short;
- workers are forked from a small fork server (`python -c`, started once, which imports the computations)
  — never from the serving process itself, whose threads and sockets a fork would copy, and without
  multiprocessing's start methods, which re-run the caller's `__main__` script in every child.

The functions a worker may run are the ones of `stead.flows._compute`, by name.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["MEMORY_LIMIT", "WORKERS", "ComputeFailed", "ComputeTimeout", "compute", "prestart"]

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
    try:
        os.nice(10)  # the serving process's event loop comes first when CPUs are short
    except OSError:
        pass
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


class _Zygote:
    """A process started once (`python -c`, so it never re-runs the caller's `__main__` as multiprocessing's
    start methods do) that imports the computations and forks a worker per request: a fresh worker costs a
    fork, not an interpreter start. It exits when this process goes (its socket ends)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the `stead` package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def fork(self) -> tuple[int, multiprocessing.connection.Connection]:
        """A new worker: (its pid, the connection to it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.sock, [b"w"], [theirs.fileno()])
                answer = b""
                while len(answer) < _PID_BYTES:
                    chunk = self.sock.recv(_PID_BYTES - len(answer))
                    if not chunk:
                        raise OSError("the compute fork server ended")
                    answer += chunk
        finally:
            theirs.close()
        return int(answer), multiprocessing.connection.Connection(ours.detach())

    def close(self) -> None:
        self.sock.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)


_ZYGOTE = "from stead.flows._sandbox import _zygote; _zygote()"
_PID_BYTES = 16


def _zygote() -> None:  # pragma: no cover - runs in the fork server process
    sock = socket.socket(fileno=int(sys.argv[1]))
    importlib.import_module(_MODULE)  # once: every worker forked from here has it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 16, 1)
        except OSError:
            return
        if not message or not fds:
            return  # the serving process is gone
        pid = os.fork()
        if pid == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _serve(multiprocessing.connection.Connection(fds[0]), MEMORY_LIMIT)
            finally:
                os._exit(0)
        os.close(fds[0])
        sock.sendall(str(pid).rjust(_PID_BYTES).encode())


class _Worker:
    def __init__(self, zygote: _Zygote) -> None:
        self.pid, self.conn = zygote.fork()

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.conn.close()


class _Pool:
    """`WORKERS` threads, each owning at most one worker process (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0
        self._local = threading.local()

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():
                self._zygote = None
                self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="stead-compute")
                self._pid = os.getpid()
            return self._executor

    def _worker(self) -> _Worker:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None:
            with self._lock:
                if self._zygote is None or self._zygote.process.poll() is not None:
                    self._zygote = _Zygote()
                zygote = self._zygote
            worker = self._local.worker = _Worker(zygote)
        return worker

    def call(self, fn: str, args: tuple[Any, ...], deadline: float, cancelled: threading.Event) -> Any:
        """In a pool thread: run `fn(*args)` in this thread's worker; kill it at `deadline` (monotonic)."""
        if time.monotonic() >= deadline or cancelled.is_set():
            raise ComputeTimeout()
        try:
            worker = self._worker()
        except OSError as e:  # the fork server is gone: a new one starts with the next computation
            with self._lock:
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = None
            raise ComputeFailed(f"no worker process could be started ({e})") from None
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

    def prestart(self) -> None:
        """Start the fork server in the background (its interpreter start is not charged to a deadline)."""
        executor = self.executor()
        with self._lock:
            if self._zygote is not None:
                return

        def start() -> None:
            with self._lock:
                if self._zygote is None:
                    self._zygote = _Zygote()

        executor.submit(start)


_POOL = _Pool()


def prestart() -> None:
    """Start the computations' fork server now, in the background (called when an agent gets tools that
    compute: the first computation then finds it running)."""
    _POOL.prestart()


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
