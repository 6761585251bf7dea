"""Engines that run the algorithm: training engines (a `TrainEngine` protocol; torch and
DeepSpeed, in process or launched over several processes) and rollout engines (HF generate
and the vLLM worker, both returning a `RolloutBatch`)."""
