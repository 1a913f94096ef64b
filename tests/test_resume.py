"""A killed run resumes where it stopped (grail.training.resume): complete checkpoints only, metrics.jsonl without
duplicate or missing steps, the same parameters as a run that was never interrupted; a second run never writes into the
first one's directory."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
from safetensors.torch import load_file

from conftest import WARM_STEPS
from grail.training.provenance import CODE_FILE
from grail.training.resume import (
    MARKER,
    complete_checkpoints,
    load_generator,
    prepare_run_dir,
    resolve_resume,
    save_generator,
)

STEPS, SAVE_EVERY = 6, 2
# The random control: GRAIL's fused saliency, then a permutation of each row's weights drawn from the trainer's own
# generator, whose state a checkpoint must hold for a resumed run to draw what an uninterrupted one drew (trainer S6)
RUN = ["--preset", "tiny-cpu", "--token_weighting", "random", "--max_steps", str(STEPS), "--save_steps",
       str(SAVE_EVERY), "--logging_steps", "1", "--per_device_train_batch_size", "16", "--task_num_train", "64",
       "--learning_rate", "1e-3", "--warmstart_steps", str(WARM_STEPS), "--seed", "7"]
VOLATILE = {"step_time", "weights/seconds", "train_runtime", "train_samples_per_second", "train_steps_per_second",
            "epoch", "total_flos",  # wall-clock figures differ between any two runs
            "train_loss"}  # the end-of-run summary: transformers averages it over the steps this process trained


def _command(cache, out, *extra):
    return [sys.executable, "-m", "grail", "train", *RUN, "--cache_dir", str(cache), "--output_dir", str(out), *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _metrics(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in VOLATILE} for line in lines]


def _checkpoint(run_dir, step, complete=True):
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / MARKER).write_text(json.dumps({"step": step}))
    return folder


def test_a_checkpoint_carries_each_process_s_generator_and_an_older_one_warns(tmp_path):
    saved = torch.Generator().manual_seed(3)
    torch.rand(5, generator=saved)
    save_generator(saved, tmp_path, rank=1)
    restored = torch.Generator().manual_seed(99)
    load_generator(restored, tmp_path, rank=1, method="random")
    assert torch.equal(torch.rand(4, generator=restored), torch.rand(4, generator=saved))
    with pytest.warns(UserWarning, match="holds no token-weighting generator state.*random"):
        load_generator(torch.Generator(), tmp_path, rank=0, method="random")  # another process's file is missing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_generator(torch.Generator(), tmp_path, rank=0, method="none")  # GRPO draws nothing: no warning


def test_resume_true_picks_the_last_complete_checkpoint_and_a_named_one_must_be_complete(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6, complete=False)  # killed while saving
    assert resolve_resume("true", tmp_path) == tmp_path / "checkpoint-4"
    assert resolve_resume(None, tmp_path) is None
    assert complete_checkpoints(tmp_path) == [tmp_path / "checkpoint-2", tmp_path / "checkpoint-4"]
    with pytest.raises(ValueError, match=f"not a complete checkpoint.*{MARKER}.*checkpoint-4"):
        resolve_resume(str(tmp_path / "checkpoint-6"), tmp_path)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        resolve_resume(str(tmp_path / "checkpoint-9"), tmp_path)
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        resolve_resume("true", tmp_path / "empty")


def test_a_second_run_into_a_used_directory_refuses_and_overwrite_removes_only_the_runs_files(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    _checkpoint(tmp_path, 2)
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.raises(ValueError, match="already holds a run.*--resume_from_checkpoint true.*--overwrite_output_dir"):
        prepare_run_dir(tmp_path, None, overwrite=False, main_process=True)
    prepare_run_dir(tmp_path, None, overwrite=True, main_process=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resuming_cuts_the_metrics_back_to_the_checkpoint_and_records_the_resume(tmp_path):
    lines = [{"step": s, "reward": s / 10} for s in (1, 2, 3, 4)] + [{"step": 2, "eval/x": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 5, "rew')
    checkpoint = _checkpoint(tmp_path, 2)
    prepare_run_dir(tmp_path, checkpoint, overwrite=False, main_process=True)
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [lines[0], lines[1], lines[4]]  # steps after the checkpoint and the torn line are gone
    (record,) = [json.loads(x) for x in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert record["from"] == str(checkpoint) and record["step"] == 2


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, warm_cache):
    """An uninterrupted run that saves every SAVE_EVERY steps."""
    cache, _ = warm_cache
    whole = tmp_path_factory.mktemp("resume") / "whole"
    subprocess.run(_command(cache, whole), env=_env(), check=True, capture_output=True, timeout=600)
    return whole


def _assert_same_run(got_dir, expected_dir):
    """The same metrics lines (wall-clock figures aside) and the same final parameters."""
    assert [m["step"] for m in _metrics(got_dir)] == [m["step"] for m in _metrics(expected_dir)]  # no duplicate/gap
    for got, expected in zip(_metrics(got_dir), _metrics(expected_dir), strict=True):
        assert got.keys() == expected.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), (got["step"], key)
    final, reference = load_file(str(got_dir / "final" / "model.safetensors")), load_file(
        str(expected_dir / "final" / "model.safetensors"))
    for name, tensor in reference.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-5, atol=1e-6)


def test_checkpointing_changes_no_number(tmp_path, warm_cache, whole_run):
    """A run that never saves while training equals one that saves every SAVE_EVERY steps: what `grail compare
    --resume` may change (grail.analysis.compare.plan.RESUME_FIELDS) decides only what a kill costs."""
    cache, _ = warm_cache
    never = tmp_path / "never"
    subprocess.run(_command(cache, never, "--save_steps", str(10 * STEPS)), env=_env(), check=True,
                   capture_output=True, timeout=600)
    saved = {path.name for path in complete_checkpoints(never)}
    assert saved <= {f"checkpoint-{STEPS}"}  # at most the save at the end: none while training
    assert {path.name for path in complete_checkpoints(whole_run)} > {f"checkpoint-{SAVE_EVERY}"}
    _assert_same_run(never, whole_run)


def test_a_run_killed_after_its_first_checkpoint_resumes_to_the_uninterrupted_result(tmp_path, warm_cache,
                                                                                       whole_run):
    """SIGKILL at a random step after the first checkpoint, then `--resume_from_checkpoint true`: the same final
    step, the same metrics lines (wall-clock figures aside), and the same parameters as an uninterrupted run."""
    cache, _ = warm_cache
    whole, killed = whole_run, tmp_path / "killed"
    kill_after = random.Random(int(time.time())).randint(SAVE_EVERY + 1, STEPS - 1)  # a step after checkpoint-2
    process = subprocess.Popen(_command(cache, killed), env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        metrics = killed / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        steps = [json.loads(x)["step"] for x in lines[:-1]]  # the last line may be half written ...
        if lines and lines[-1].endswith("}"):  # ... or whole: waiting for the next line could let the run reach
            steps.append(json.loads(lines[-1])["step"])  # final/ before the kill (seen with kill_after = STEPS - 1)
        if steps and max(steps) >= kill_after and complete_checkpoints(killed):
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    assert process.wait(timeout=60) == -signal.SIGKILL, f"the run ended before step {kill_after}; nothing to resume"
    assert not (killed / "final").exists()
    again = subprocess.run(_command(cache, killed), env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 2 and "--resume_from_checkpoint true" in again.stderr  # no silent second run
    resumed = subprocess.run(_command(cache, killed, "--resume_from_checkpoint", "true"), env=_env(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"done: {STEPS} steps" in resumed.stdout
    _assert_same_run(killed, whole)
    step = json.loads((killed / "resumed.jsonl").read_text())["step"]
    assert step >= SAVE_EVERY
    attempts = [json.loads(x)["from_step"] for x in (killed / CODE_FILE).read_text().splitlines()]
    assert attempts == [0, step]  # the start and the resume; the refused rerun wrote none



def test_a_signal_saves_a_checkpoint_at_the_end_of_the_step_and_the_resume_is_exact(tmp_path, warm_cache, whole_run):
    """SIGUSR1 during training (a batch job's warning that its time is up): the run saves a checkpoint at the end of
    the step it is in, whatever save_steps says, and exits with STOPPED_EXIT_CODE without a final model; resumed,
    it ends as the uninterrupted run did."""
    from grail.training.stop import STOPPED_EXIT_CODE

    cache, _ = warm_cache
    stopped = tmp_path / "stopped"
    process = subprocess.Popen(_command(cache, stopped), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        metrics = stopped / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(line.endswith("}") and json.loads(line).get("step") == SAVE_EVERY for line in lines):
            process.send_signal(signal.SIGUSR1)  # during step SAVE_EVERY + 1, between save_steps' checkpoints
            break
        time.sleep(0.02)
    _, err = process.communicate(timeout=600)
    assert process.returncode == STOPPED_EXIT_CODE, err[-2000:]
    (checkpoint,) = [p for p in complete_checkpoints(stopped) if p.name != f"checkpoint-{SAVE_EVERY}"]
    step = int(checkpoint.name.split("-")[1])
    assert SAVE_EVERY < step < STEPS and not (stopped / "final").exists()
    assert f"stopped by SIGUSR1 after step {step}" in err and "--resume_from_checkpoint true" in err
    resumed = subprocess.run(_command(cache, stopped, "--resume_from_checkpoint", "true"), env=_env(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((stopped / "resumed.jsonl").read_text())["step"] == step
    _assert_same_run(stopped, whole_run)
