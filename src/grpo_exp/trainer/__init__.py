"""GRPOExpTrainer (hooks only) and the one seam through which grpo_exp reads TRL's state."""
