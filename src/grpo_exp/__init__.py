"""grpo_exp: Hydra-configured GRPO experiments on top of TRL."""

__version__ = "0.1.0"
