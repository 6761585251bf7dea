"""Engine wiring of the recipe layer (the engines themselves, registered by name, are in
grpo_core/engines/): `availability` runs the selected engines' installation checks before
any stage, `train_engines` builds the TrainEngine of the GRPO and reward-model stages with
their optimizer settings, `policy_updaters` runs the GRPO update in process or through the
deepspeed launcher, `sampling` holds a run's rollout engines (one kept worker reused by
every stage), and `ray_shards` spreads sampling over a Ray cluster."""
