"""grail-rl's own credit signals (docs/results/credit-screen.md chose the first), registered as plug-ins
through the public API (the `grail.methods` entry points of grail-rl's own pyproject.toml), as any package's method
would be: GRAIL's saliency over the token's surprise (`grail_over_surprise`), and OAR-P learned online from a few
exact rows a step (`oar_p_amortized`)."""
