"""Experiment tracking: the run's committed rows also sent to MLflow and TensorBoard
(flows/tracking/run_tracking.py). This package's config module is torch- and mlflow-free."""
