"""Token-credit methods from the 2025–26 literature, each a plug-in registered through the public API (the
`grail.methods` entry points of grail-rl's own pyproject.toml), exactly as another package's method would be: KTAE
(`ktae`), counterfactual span masking (`span_mask`) and EAPO-style entropy reallocation (`eapo`)."""
