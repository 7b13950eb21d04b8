"""``python -m proxy`` is ``memory-proxy``."""

import sys

from proxy.cli import main

sys.exit(main())
