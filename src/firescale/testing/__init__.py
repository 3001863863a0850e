"""Test infrastructure that ships with the package: the virtual multi-node Slurm cluster."""
