"""DVC stage entry points: thin click commands over the tfdist library.

Importing this package is the first thing every stage process does (``python
stages/train.py`` imports ``stages._cli`` before any tfdist module; ``python -m
stages.train`` imports the package itself), so this is where TensorFlow's native
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
