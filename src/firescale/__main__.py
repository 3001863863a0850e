"""`python -m firescale` is the `firescale` command."""
import sys

from .cli import main

sys.exit(main())
