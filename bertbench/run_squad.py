"""`python -m bertbench.run_squad`: the original suite's module name for `bertbench.runners.squad`."""

import sys

from bertbench.runners.squad import main

if __name__ == "__main__":
    sys.exit(main())
