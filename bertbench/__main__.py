import sys

from bertbench.cli import main

sys.exit(main())
