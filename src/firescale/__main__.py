"""`python -m firescale` is the `firescale` command."""
import sys

from firescale.cli import main

sys.exit(main())
