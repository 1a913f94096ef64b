"""Training on TRL: `GRAILConfig` (`config`), config values from presets, files and flags (`overrides`), the data
(`data`), `GRAILTrainer` (`trainer`), one run (`run`), resuming (`resume`), the held-out accuracy demo and compare
share (`heldout`) and `grail demo` (`demo`)."""
