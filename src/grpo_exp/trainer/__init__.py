"""GRPOExpConfig and GRPOExpTrainer (hooks only); the one seam through which grpo_exp reads TRL's state, and the
features beside it: zero-variance groups, the sampling copy, the shared-prompt forward."""
