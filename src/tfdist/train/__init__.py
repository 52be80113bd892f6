"""The train stage: this process's role (stage), the run's layers (task_run, chief_run), one fit (fit),
and what they use: checks, models, precision, input pipeline, callbacks, resume, step costs.

Modules import TensorFlow at their top; stage.py does not, so a launcher that only waits starts
in a blink and imports the rest where a role trains.
"""
