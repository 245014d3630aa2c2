"""Multi-turn, tool-using rollouts: the rollout engine, its tools, and Flow-GRPO credit assignment."""
