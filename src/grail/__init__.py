"""grail-rl: GRPO with token-level credit assignment on top of TRL."""
__version__ = "0.1.0"
