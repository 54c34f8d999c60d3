"""``python -m adaptcq``: the ``adaptcq`` command (``adaptcq.cli.main``)."""

import sys

from adaptcq.cli import main

if __name__ == "__main__":
    sys.exit(main())
