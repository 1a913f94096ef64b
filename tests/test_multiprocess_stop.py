"""A stop signal (grail.training.stop) to one process of a 2-process gloo run: both processes save the same
checkpoint and stop, and the run resumes on 2 processes."""

import pytest

from launching import FAST, _launch, _records

# ---------------------------------------------------------------- a stop signal to one process of two

SIGNAL_ONE_RANK = '''
import os, signal, sys

from grail.cli import main
from grail.training.trainer import GRAILTrainer

original_step = GRAILTrainer.training_step


def training_step(self, model, inputs, *args, **kwargs):
    if self.accelerator.process_index == 1 and self.state.global_step == 1 and not getattr(self, "_signalled", 0):
        self._signalled = 1  # during step 2, to process 1 only
        os.kill(os.getpid(), signal.SIGUSR1)
    return original_step(self, model, inputs, *args, **kwargs)


GRAILTrainer.training_step = training_step
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.slow
def test_a_stop_signal_to_one_process_stops_both_at_the_same_step_and_they_resume(tmp_path, warm_cache):
    """SIGUSR1 to one process of a 2-process run: both save checkpoint-2 and stop there (the flag is shared at the
    step's end, so no process waits for the other in a collective), with the stop's exit code; resumed on 2
    processes, the run ends with every step logged once."""
    from grail.training.resume import complete_checkpoints

    cache, _ = warm_cache
    script = tmp_path / "signal_one.py"
    script.write_text(SIGNAL_ONE_RANK)
    run = tmp_path / "run"
    args = [str(script), "train", *FAST, "--max_steps", "4", "--token_weighting", "grail", "--cache_dir", str(cache),
            "--output_dir", str(run)]
    stopped = _launch(tmp_path, *args, check=False)
    assert stopped.returncode != 0, stopped.stderr[-3000:]  # accelerate reports the processes' STOPPED_EXIT_CODE
    assert "stopped by SIGUSR1 after step 2" in stopped.stderr
    assert "stopped by a signal to another process after step 2" in stopped.stderr
    assert [p.name for p in complete_checkpoints(run)] == ["checkpoint-2"] and not (run / "final").exists()
    _launch(tmp_path, *args, "--resume_from_checkpoint", "true")
    steps = [x["step"] for x in _records(run / "metrics.jsonl") if "reward" in x]
    assert steps == [1, 2, 3, 4] and (run / "final" / "config.json").is_file()
