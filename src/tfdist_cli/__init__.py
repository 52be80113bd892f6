"""tfdist's command line: the ``tfdist`` command for people, and the contract every command keeps.

:mod:`tfdist_cli.contract` is what the DVC stages (``stages/``) and the
``tfdist`` subcommands share: ``--params``/``--set``, logging, and exit codes
(0 done, 2 a usage or configuration error in one line, 1 a failure while
running). :mod:`tfdist_cli.main` is the ``tfdist`` group; each of its
subcommands lives in a module named after it. The library (``tfdist``) never
imports click or this package.
"""
