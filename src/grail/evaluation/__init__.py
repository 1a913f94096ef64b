"""Evaluation, without TRL: the grader (`grader`, `guards`, `reference_text`, `grading_workers`), the training reward
(`rewards`), the benchmarks (`benchmarks`, `benchmark_sources`), the harness (`harness`), its scores (`scores`), the
release's scoring (`release_scoring`), and `grail eval` / `grail grader-check` (`cli`, `grader_check`)."""
