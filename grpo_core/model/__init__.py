"""The policy's lifecycle: its settings, building or loading it, forward passes for
per-token log-probs, warm start (SFT) and evaluation (greedy accuracy, Pass@K, Maj@K)."""
