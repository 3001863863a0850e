"""Training: the Horovod data-parallel loop, Caffe update rules, snapshots, evaluation and clocks."""
