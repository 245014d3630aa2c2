"""Built-in environments in TRL's environment_factory convention, for rollout=environment."""
