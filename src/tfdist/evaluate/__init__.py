"""The evaluate stage: each trained model's test metrics, onto its train run in MLflow (stage)."""
