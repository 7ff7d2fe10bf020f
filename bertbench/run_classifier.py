"""`python -m bertbench.run_classifier`: the original suite's module name for `bertbench.runners.classifier`."""

import sys

from bertbench.runners.classifier import main

if __name__ == "__main__":
    sys.exit(main())
