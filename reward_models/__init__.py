"""Reward models and what feeds them: ORM and Math-Shepherd PRM labels (`labelling`), the
models (`models`), continual training (`training`), scoring (`scoring`), evaluation
(`evaluate`), and the reward parts whose weighted sum is GRPO's reward (`parts`,
`grpo_reward`)."""
