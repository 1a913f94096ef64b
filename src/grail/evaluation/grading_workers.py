"""The processes grading runs in (grail.evaluation.grader's docstring, "Timeouts and where the work runs"): what a
worker receives (`Scoring`: an extraction and a content grader) and returns (`GradeResult`), the spawned worker
process, and the pool that feeds its workers one item at a time, each under a wall-clock bound.
grail.evaluation.grader holds the grading itself and the API (`grade`, `grade_many`, `GradingPool`), and re-exports
these names.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["default_workers", "GradeResult", "MAX_WORKERS", "Scoring", "WORKER_START_S"]

WORKER_START_S = 60  # bound on spawning a worker process and importing math-verify in it
MAX_WORKERS = 8  # default cap on grading processes: grading keeps up with generation well below it
# the content graders' module, imported by a worker before it reports ready (by name: it imports this module)
GRADER_MODULE = "grail.evaluation.grader"


@dataclass(frozen=True)
class GradeResult:
    """One graded completion. extracted: the last complete box's content (None without a box); reason: see
    grail.evaluation.grader's docstring ("ok" means the comparison ran: `correct` is its verdict)."""

    correct: bool
    extracted: str | None
    reason: str


@dataclass(frozen=True)
class Scoring:
    """How a completion is graded. `extract(completion)`: the answer text (None: no answer), taken in the calling
    process; `grade_content(text, reference, timeout_s)`: its GradeResult, run on a main thread (this one or a
    worker's) where math-verify's alarms work. Both must be module-level functions: workers receive them by name.
    `description`: one line for results files, saying which scoring produced them."""

    name: str
    extract: Callable[[str], str | None]
    grade_content: Callable[[str | None, Any, float], GradeResult]
    description: str = ""



# ---- worker processes -----------------------------------------------------------------------------------------
def _worker_main(conn: Connection) -> None:
    """A worker process: grade (grade_content, content, reference, timeout_s) items on this main thread until told
    to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then stops the workers
    grader = importlib.import_module(GRADER_MODULE)  # math-verify loads under WORKER_START_S, not an item's deadline,
    grader.grade("\\boxed{1}", "1")  # and builds its parsers on a first item (~0.2 s, 70x a later one)
    conn.send("ready")
    while True:
        try:
            item = conn.recv()
        except EOFError:  # the parent is gone
            return
        if item is None:
            return
        try:
            grade_content, *arguments = item
            conn.send(grade_content(*arguments))
        except Exception as err:  # a bug, not a bad answer: the parent re-raises it
            conn.send(RuntimeError(f"grader worker failed: {type(err).__name__}: {err}"))


class _Worker:
    """One spawned worker process, the parent's end of its pipe, and the item it is grading."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="grail-grader")
        self.process.start()
        child.close()
        self.ready = False
        self.index: int | None = None  # the item being graded
        self.deadline = time.monotonic() + WORKER_START_S  # for "ready", then for the item

    def stop(self, kill: bool = False) -> None:
        if not kill and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(timeout=1)
            except OSError:
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def default_workers() -> int:
    """Grading processes when the caller gives none: one per CPU core, at most MAX_WORKERS."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


class _Pool:
    """Up to `size` worker processes (one started only while the items waiting outnumber the started, free workers)
    and the loop that feeds them, one item each at a time. (Sending a second item ahead to save the round trip gained
    2% on MATH500 solutions, and queued items behind a slow one.)"""

    def __init__(self, size: int) -> None:
        self.slots: list[_Worker | None] = [None] * size

    def grade(self, contents: Sequence[str | None], references: Sequence[Any], timeout_s: float,
              item_deadline_s: float, scoring: Scoring) -> list[GradeResult]:
        results: list[GradeResult | None] = [None] * len(contents)
        queue = deque(range(len(contents)))
        while queue or any(w is not None and w.index is not None for w in self.slots):
            for k, worker in enumerate(self.slots):
                if worker is None and len(queue) > self._free():  # never more processes than the work needs
                    worker = self.slots[k] = _Worker()
                if worker is not None and worker.ready and worker.index is None and queue:
                    index = queue.popleft()
                    try:
                        worker.conn.send((scoring.grade_content, contents[index], references[index], timeout_s))
                    except OSError:  # it died while idle: not this item's doing, so the item goes back
                        queue.appendleft(index)
                        self._drop(worker)
                        continue
                    worker.index, worker.deadline = index, time.monotonic() + item_deadline_s
            waiting = [w for w in self.slots if w is not None and (not w.ready or w.index is not None)]
            if not waiting:  # a worker was found dead before it got an item: start another
                continue
            until = min(w.deadline for w in waiting)
            ready = wait([w.conn for w in waiting], timeout=max(0.0, until - time.monotonic()))
            for worker in waiting:
                if worker.conn in ready:
                    self._receive(worker, contents, results)
                elif time.monotonic() >= worker.deadline:
                    self._drop(worker)
                    if worker.index is None:
                        raise RuntimeError(f"a grader worker process did not start within {WORKER_START_S} s.")
                    results[worker.index] = GradeResult(False, contents[worker.index], "timeout")
        return results  # type: ignore[return-value]  # every index was filled

    def _free(self) -> int:
        """Started workers that can take an item now or once they are ready."""
        return sum(w is not None and (not w.ready or w.index is None) for w in self.slots)

    def started(self) -> int:
        """Worker processes alive in the pool."""
        return sum(w is not None for w in self.slots)

    def _receive(self, worker: _Worker, contents: Sequence[str | None], results: list) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):  # the process exited
            self._drop(worker)
            if not worker.ready:
                raise RuntimeError(f"a grader worker process exited while starting (exit code "
                                   f"{worker.process.exitcode}).") from None
            if worker.index is not None:
                results[worker.index] = GradeResult(False, contents[worker.index], "worker_died")
            return
        if isinstance(message, Exception):
            raise message
        if message == "ready":
            worker.ready = True
        else:
            results[worker.index] = message
            worker.index = None

    def _drop(self, worker: _Worker) -> None:
        worker.stop(kill=True)
        self.slots[self.slots.index(worker)] = None

    def close(self) -> None:
        for k, worker in enumerate(self.slots):
            if worker is not None:
                worker.stop()
                self.slots[k] = None
