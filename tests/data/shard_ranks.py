"""Run as N MPI ranks: each reads its shard of a dataset for one epoch; rank 0 checks the union."""
import sys

import numpy as np
from mpi4py import MPI

from firescale.data.readers import open_dataset, shard_indices

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
path, fmt, b = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = open_dataset(path, "train", fmt=fmt)
n = ds.num_records - ds.num_records % (b * size)  # whole global batches of the first epoch
mine_idx, mine_labels = [], []
for start in range(0, n, b * size):
    idx = shard_indices(ds.num_records, 42, start, b * size, rank, size)
    _, labels = ds.read(idx)
    mine_idx.append(idx)
    mine_labels.append(labels)
gathered = comm.gather((np.concatenate(mine_idx), np.concatenate(mine_labels)), root=0)
if rank == 0:
    every = np.concatenate([g[0] for g in gathered])
    assert len(every) == n and len(np.unique(every)) == n, "a record was read twice or not at all"
    _, all_labels = ds.read(np.arange(ds.num_records))
    for idx, labels in gathered:
        assert np.array_equal(all_labels[idx], labels)
    print(f"OK {size} ranks read {n} distinct records")
