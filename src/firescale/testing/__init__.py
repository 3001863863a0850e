"""Test infrastructure that ships with the package: the virtual multi-node Slurm cluster (`vcluster`, built
from `layout`, `host_files`, `cpusets`, `namespaces` and `daemons`) and the slurm.conf of every test Slurm."""
