"""The PyTorch backend: the net as a torch.nn.Module in NCHW, Caffe's solvers, the loss, gradients and evaluation."""
