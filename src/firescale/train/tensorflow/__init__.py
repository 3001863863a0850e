"""The TensorFlow backend: Horovod ranks, the net as a tf.Module, Caffe's solvers, traced steps."""
