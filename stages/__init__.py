"""DVC stage entry points, exactly the commands dvc.yaml runs: thin click commands over the tfdist library.

Their contract (``--params``, ``--set``, exit codes) is :mod:`tfdist_cli.contract`; the tools for people
are the ``tfdist`` command (:mod:`tfdist_cli.main`).

Importing this package is the first thing every stage process does (each
script's first import; ``python -m stages.train`` imports the package itself),
so this is where TensorFlow's native
start-up chatter is filtered out of stderr, before TensorFlow loads
(:mod:`tfdist.native_logs`; ``TFDIST_TF_LOGS=1`` shows it). Only in a process
that runs a stage script: a test or notebook that imports a stage keeps its stderr.
"""

import sys
from pathlib import Path

from tfdist.native_logs import filter_native_stderr

# ``python -m stages.x`` imports this package while sys.argv[0] is still "-m"; ``python stages/x.py``
# has the script's path there: a stages/ folder, not necessarily this one (DVC's experiment copies and
# test copies run their stages/ scripts with this installed package).
if sys.argv and (sys.argv[0] == "-m" or Path(sys.argv[0]).parent.name == Path(__file__).parent.name):
    filter_native_stderr()
