"""The options of grail-rl, without torch or TRL: the choices, the token-weighting options declared once
(`WeightingFields`) and resolved (`WeightingOptions`) (`choices`), the fields
`GRAILConfig` adds to TRL's (`fields`), named presets (`presets`), the prompt template (`prompts`), the sampling
backends' interface (`sampling`) and a run directory's checkpoints (`checkpoint_dirs`)."""
