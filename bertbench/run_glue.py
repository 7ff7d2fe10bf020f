"""`python -m bertbench.run_glue`: NVIDIA's and HF's script name for `bertbench.runners.classifier`."""

import sys

from bertbench.runners.classifier import main

if __name__ == "__main__":
    sys.exit(main())
