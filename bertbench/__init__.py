"""bertbench: a BERT training benchmark suite on PyTorch."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# A bertbench command handles SIGTERM and SIGINT from here on, before its imports (torch: seconds): `python -m
# bertbench[.MODULE]` (argv[0] is "-m" while Python imports this package to find the module) or the `bertbench` script.
# Importing bertbench from other code changes no handler.
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "bertbench":
    from bertbench.common.signals import handle_signals_in_process

    handle_signals_in_process()
