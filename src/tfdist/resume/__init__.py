"""Resume in one room: a run's backup, the epochs it restores, the metrics outbox, and what a rerun skips.

backup (the folders and their state.json, no TensorFlow), checkpoints (the
Keras callbacks that fill them every epoch and restore from them), outbox
(each backed-up epoch's metrics, sent off the training path), rerun (the one
rule: what the backup or the MLflow run holds already is not done again).
"""
