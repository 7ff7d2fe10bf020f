"""`python -m bertbench.run_qa`: HF's script name for `bertbench.runners.squad`."""

import sys

from bertbench.runners.squad import main

if __name__ == "__main__":
    sys.exit(main())
