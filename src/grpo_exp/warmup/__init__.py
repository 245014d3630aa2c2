"""The supervised warm-up stage before GRPO (warmup=sft): demonstrations from a source (grpo_exp.warmup.sources),
TRL's SFTTrainer on them (grpo_exp.warmup.stage), then GRPO on the warmed policy, in one run directory."""
