"""reward_models package."""
