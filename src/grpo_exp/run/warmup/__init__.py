"""The supervised warm-up stage before GRPO (warmup=sft): demonstrations from a source
(grpo_exp.run.warmup.sources), TRL's SFTTrainer on them (grpo_exp.run.warmup.stage), then GRPO on the warmed policy,
in one run directory."""
