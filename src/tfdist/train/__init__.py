"""The train stage: this process's role (stage), a run's phases top-down (phases), the trainer and the chief's
recording (task_run, chief_run), one fit (fit), and what they use: checks, models, precision, input pipeline,
callbacks, step costs. Backups and reruns are :mod:`tfdist.resume`'s.

Modules import TensorFlow at their top; stage.py does not, so a launcher that only waits starts
in a blink and imports the rest where a role trains.
"""
