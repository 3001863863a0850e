"""Benchmarks that print numbers: allreduce, the trainer against a bare Horovod loop, I/O, memory."""
