"""tfdist: normal vs distributed TensorFlow training on MNIST, as a DVC pipeline tracked in MLflow.

Importing any part of tfdist selects Keras 2 (tf_keras) for ``tf.keras``: it
must happen before TensorFlow is first imported, by us or by MLflow's
TensorFlow flavor, and the package import is the earliest point there is.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep C++ INFO/WARNING chatter off stage logs
# MLflow's INFO lines (creating tables, experiments) are not the user's business in a stage log.
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
# No usage data leaves the machine from MLflow (its client, and the UI and server started from here);
# MLFLOW_DISABLE_TELEMETRY=false in the environment turns it back on. DVC's is off in .dvc/config.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

__version__ = "0.1.0"
