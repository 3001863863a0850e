"""The PyTorch backend: torch.distributed ranks, the net as an nn.Module, Caffe's solvers, the steps."""
