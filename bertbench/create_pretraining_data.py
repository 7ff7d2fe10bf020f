"""`python -m bertbench.create_pretraining_data`: the original suite's module name for `bertbench.tasks.create_pretraining_data`."""

import sys

from bertbench.tasks.create_pretraining_data import main

if __name__ == "__main__":
    sys.exit(main())
