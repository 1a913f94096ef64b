"""Stopping a run cleanly on a signal, for machines whose time runs out (a batch job's wall-time limit, an allocation
that ends, a preemptible node).

SIGUSR1 or SIGTERM while the run trains asks for a stop at the end of the current optimiser step: the trainer saves
a checkpoint there (marked complete as any other) and stops, and `train` raises TrainingStopped instead of saving a
final model. `--resume_from_checkpoint true` (`grail compare --resume`) goes on from that checkpoint exactly as from
any other. A second signal ends the process at once (one within SAME_REQUEST_S of the first is taken for the same
request delivered twice), and a signal outside the training loop (loading, evaluation)
ends it as it would have without this module. With several processes, the request is shared at each step end (one
gather of a flag, the trainer's own), so that every process saves and stops at the same step even when only one
was signalled.

Under SLURM: `#SBATCH --signal=USR1@600` sends SIGUSR1 ten minutes before the limit; give more than one step's time.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from transformers import TrainerCallback

__all__ = ["SAME_REQUEST_S", "STOPPED_EXIT_CODE", "STOP_SIGNALS", "StopOnSignal", "TrainingStopped"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
SAME_REQUEST_S = 5.0  # a second signal this soon is the first delivered again (a job's whole process group signalled,
# and its scheduler passing the signal on), not a request to stop at once
STOPPED_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: the work is not done, and running the same command again goes on


class TrainingStopped(Exception):
    """A run stopped on a signal after saving `checkpoint` at `step`; the same command with resume goes on."""

    def __init__(self, step: int, checkpoint: str, signal_name: str):
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name
        super().__init__(f"stopped by {signal_name} after step {step}; {checkpoint} is saved: run the same command "
                         "with --resume_from_checkpoint true (grail compare --resume DIR) to go on from it")


class StopOnSignal(TrainerCallback):
    """Turns STOP_SIGNALS during training into a checkpoint and a stop at the end of the current step (module
    docstring). `signal_name`: the signal that asked, or None. `any_process`: a flag or-ed over a distributed run's
    processes (GRAILTrainer._any_process; the flag itself until set)."""

    def __init__(self):
        self.any_process = lambda flag: flag  # the trainer's reduction over processes, set once it exists
        self.signal_name: str | None = None
        self._asked_at = 0.0
        self._previous: dict[int, object] = {}

    def _ask(self, signum, frame) -> None:
        if self.signal_name is not None:
            if time.monotonic() - self._asked_at >= SAME_REQUEST_S:  # a second request: stop now, as without this
                self._restore()
                os.kill(os.getpid(), signum)
            return
        self.signal_name, self._asked_at = signal.Signals(signum).name, time.monotonic()
        print(f"grail: {self.signal_name}: saving a checkpoint at the end of this step, then stopping (send it again "
              "to stop at once)", flush=True)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._ask) for s in STOP_SIGNALS}

    def on_step_end(self, args, state, control, **kwargs):
        if self.any_process(self.signal_name is not None):
            self.signal_name = self.signal_name or "a signal to another process"
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self._restore()
