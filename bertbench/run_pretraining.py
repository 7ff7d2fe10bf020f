"""`python -m bertbench.run_pretraining`: the original suite's module name for `bertbench.runners.pretraining`."""

import sys

from bertbench.runners.pretraining import main

if __name__ == "__main__":
    sys.exit(main())
