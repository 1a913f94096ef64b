"""Null methods that a token-credit method has to beat, registered as plug-ins through the public API (the
`grail.methods` entry points of grail-rl's own pyproject.toml), as any package's method would be: the position-only
null (`position`)."""
