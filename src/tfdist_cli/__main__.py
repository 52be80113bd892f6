"""``python -m tfdist_cli`` is the ``tfdist`` command (for a clone whose environment has no console script)."""

from tfdist_cli.main import cli

cli()
