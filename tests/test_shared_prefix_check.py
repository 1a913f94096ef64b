"""perf/experiments/shared_prefix_check.py: computing a prompt once for its G completions (KV cache repeated over rows,
gradient through it) gives the plain forward's completion log-probs and parameter gradients to float rounding, on Llama,
Qwen3 and Gemma 3 (sliding window shorter than the prompt)."""

import shared_prefix_check


def test_a_shared_prompt_forward_matches_the_plain_one_on_three_families(capsys):
    results = shared_prefix_check.main(["--prompt", "20", "--completion", "7", "--rows", "4"])
    assert set(results) == {"llama", "qwen3", "gemma3"}
    for name, r in results.items():
        assert r["logp_max_abs_diff"] < 1e-5, name
        assert r["grad_max_rel_diff"] < 1e-4, name
        assert r["parameters"] > 0
    assert "gemma3: max" in capsys.readouterr().out
