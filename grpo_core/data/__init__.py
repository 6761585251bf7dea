"""What the policy is trained on: tasks (problems, gold answers, verifiers), answer parsing,
reasoning steps of a completion, and padded prompt + completion batches."""
