"""The small `grail compare` that tests/test_compare*.py run: 2 arms × 2 seeds of 2 steps from the tiny warm start,
8 held-out problems."""

from conftest import WARM_STEPS

ARMS = "none,grail@saliency_leaf=middle"
# lr 1e-3 moves the tiny model in 2 steps, so arms and seeds differ; 2 prompts × 8 completions per step
FAST = ["--max_steps", "2", "--save_steps", "1", "--per_device_train_batch_size", "16", "--task_num_train", "64",
        "--task_num_heldout", "8", "--learning_rate", "1e-3", "--warmstart_steps", str(WARM_STEPS)]


def compare_argv(cache, out, arms=ARMS, seeds="2", *extra) -> list[str]:
    """`grail compare`'s arguments for `arms` × `seeds` with FAST's settings, the AUROC on 8 rows."""
    return ["compare", "--arms", arms, "--seeds", seeds, *FAST, "--auroc-rows", "8", "--cache_dir", str(cache),
            "--output_dir", str(out), *extra]
