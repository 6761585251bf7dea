"""The ML library of itergrpo, by role:

- `algo`: the GRPO formulas (advantages, losses, reward assembly, the update, one GRPO step)
  and their settings; pure tensor functions.
- `engines`: what runs them: training engines (torch, DeepSpeed in process or launched) and
  rollout engines (HF generate, the vLLM worker).
- `data`: tasks and their answers, reasoning steps, padded policy batches.
- `model`: the policy's lifecycle: building or loading it, forward passes for log-probs,
  warm start (SFT), evaluation.

Nothing here imports Prefect, the reward models or the run store.
"""
