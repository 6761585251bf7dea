"""grpo_core package."""
