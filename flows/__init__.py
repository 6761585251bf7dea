"""The recipe layer: the run's config, context, stages and loop, the Prefect flow, the CLI and
the ablation. It composes grpo_core, reward_models and storage, and is the only package that
imports Prefect (docs/architecture.md)."""
