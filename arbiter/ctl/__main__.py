"""``python -m arbiter.ctl``: judgectl."""

import sys

from arbiter.ctl.main import main

sys.exit(main())
