"""`python -m regen.emulator`: one emulated SGLang server (see regen.emulator.cli)."""

import sys

from regen.emulator.cli import main

sys.exit(main())
