"""``python -m host.cli``: the ``flashlm`` command."""
import sys

from .main import main

sys.exit(main())
