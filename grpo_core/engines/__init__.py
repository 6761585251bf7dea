"""Engines that run the algorithm, registered by name (`registry`): training engines (torch,
DeepSpeed in process or launched over several processes) and rollout engines (HF, and the
vLLM worker in its own environment), each honouring its protocol in grpo_core/contracts."""
