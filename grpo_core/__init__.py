"""The ML library of itergrpo, in layers (each imports only its own layer or lower ones):

- `contracts`: the seams (rollout and training protocols, the policy batch, numerics guards,
  the user-error base, the registry of extension points).
- `data`: tasks and their answers, reasoning steps.
- `model`: the policy's lifecycle: building or loading it, forward passes for log-probs,
  warm start (SFT), evaluation.
- `algo`: the GRPO formulas (advantages and the estimators by name, losses, reward assembly,
  the update, one GRPO step) and their settings; pure tensor functions.
- `engines`: what runs them: training engines (torch, DeepSpeed in process or launched) and
  rollout engines (HF, the vLLM worker), registered by name.

Nothing here imports Prefect, the reward models or the run store.
"""
