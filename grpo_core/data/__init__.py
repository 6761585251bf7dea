"""What the policy is trained on: tasks (problems, gold answers, verifiers), answer parsing,
and the reasoning steps of a completion."""
