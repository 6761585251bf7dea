"""The GRPO algorithm (docs/algorithm.md): advantages, losses, reward assembly, the policy update
and one GRPO step, with their settings. Pure functions of tensors: no I/O, no globals."""
