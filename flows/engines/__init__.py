"""Engine wiring of the recipe layer: which training and sampling engines a config selects,
built for the stages. `availability` checks they are installed, `train_engines` builds the
TrainEngine of the GRPO and reward-model stages, `policy_updaters` runs the GRPO update in
process or through the deepspeed launcher, `sampling` builds the HF or vLLM sampler of a
stage, and `ray_shards` spreads sampling over a Ray cluster."""
