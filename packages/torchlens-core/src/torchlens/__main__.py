"""``python -m torchlens``: the command line (so ``torchrun -m torchlens record ...`` works)."""

import sys

from .cli import main

sys.exit(main())
