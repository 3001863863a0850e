"""The cluster a job runs on: its site profile, launchers, allreduce algorithm and Horovod knobs."""
