"""firescale: measure, predict and report how deep-network training scales on supercomputers."""

__version__ = "0.1.0"
