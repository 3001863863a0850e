"""One rank of tests/train/test_torch_distributed.py: firescale's Rank on its process group (auto, or the one named),
its collectives and gradient buckets; writes what it saw to OUT/rank-R.json.  Usage: torch_ranks.py OUT [GROUP]"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from firescale.train.torch.distributed import (
    FlatSum,
    GradientBuckets,
    describe_allreduce,
    init_rank,
    summed_gradients,
    versions,
)


def listed(t: torch.Tensor) -> list:
    return [str(t.dtype).removeprefix("torch."), list(t.shape), t.flatten().tolist()]


def collectives(rank) -> dict:
    r = rank.rank
    inputs = [torch.full((2, 3), r + 1.0), torch.arange(5, dtype=torch.int64) * (r + 1),
              torch.tensor([0.25 * (r + 1)], dtype=torch.float64), torch.full((4,), 10.0 ** r),
              torch.tensor(7 * r, dtype=torch.int32)]
    before = [t.clone() for t in inputs]
    sums = rank.sum(inputs)
    values = [torch.full((3,), float(r)), torch.full((2, 2), 10 + r, dtype=torch.int32)]
    rank.broadcast_tensors(values)
    return {"sum": [listed(t) for t in sums], "inputs_kept": all(torch.equal(a, b) for a, b in zip(inputs, before)),
            "numbers": rank.sum_numbers([1.0, r, 2.0 ** 40 + r]).tolist(),
            "broadcast_tensors": [listed(t) for t in values],
            "broadcast_object": rank.broadcast_object({"from": r, "list": [r] * 3}),
            "gather_object": rank.gather_object(("rank", r)),
            "bf16": bf16(rank)}


def bf16(rank) -> dict:
    """A bfloat16 sum and broadcast: values whose sum bf16 rounds (1 + 2**-8 is a tie between 1 and 1 + 2**-7)."""
    r = rank.rank
    values = torch.tensor([1.0, 2.0 ** -8 if r else 1.0, 3.0 * (r + 1), 0.1 * (r + 1)], dtype=torch.bfloat16)
    summed = rank.sum([values, torch.ones(2)])
    sent = [torch.full((3,), 0.5 + r, dtype=torch.bfloat16)]
    rank.broadcast_tensors(sent)
    return {"sum": listed(summed[0]), "float32_beside": listed(summed[1]), "broadcast": listed(sent[0])}


def buckets(rank) -> dict:
    """Two steps of a tiny net, its gradients summed in buckets during backward and grouped after it."""
    torch.manual_seed(0)   # one net on every rank, as after a broadcast of rank 0's weights
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    unused = nn.Parameter(torch.ones(2))   # never in the forward: its sum is zeros
    parameters = [unused, *net.parameters()]   # first: alone in the last bucket
    summed = GradientBuckets(rank, parameters, bucket_bytes=100)
    data = torch.Generator().manual_seed(100 + rank.rank)   # each rank its own batch
    out = {"buckets": summed.buckets, "steps": []}
    for _ in range(2):
        for p in parameters:
            p.grad = None
        net(torch.randn(8, 6, generator=data)).square().sum().backward()
        started = len(summed._started)
        overlapped = summed.wait()
        grouped = summed_gradients(rank, parameters)
        local = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        everyone = rank.gather_object([g.tolist() for g in local])
        by_hand = [torch.tensor(a) + torch.tensor(b) for a, b in zip(*everyone)]
        out["steps"].append({
            "started_in_backward": started,
            "overlapped_equals_grouped": all(torch.equal(a, b) for a, b in zip(overlapped, grouped)),
            "overlapped_equals_by_hand": all(torch.equal(a, b) for a, b in zip(overlapped, by_hand)),
            "shapes_kept": all(a.shape == p.shape for a, p in zip(overlapped, parameters)),
            "unused": overlapped[0].tolist(),
            "first": overlapped[1].flatten().tolist()})
    summed.remove()
    return out


def flat_sum(rank) -> dict:
    """Two sums through one FlatSum of three blobs' shapes: each rank's gradients, loss and flag its own."""
    shapes = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(1, 1, 2)]
    summed = FlatSum(rank, shapes)
    r, steps, pairs = rank.rank, [], []
    for step in range(2):
        grads = [torch.full(t.shape, 10.0 * step + r + k) for k, t in enumerate(shapes)]
        kept = [g.clone() for g in grads]
        views, pair = summed(grads, torch.tensor(0.5 + r + step), torch.tensor(float(r == 1 and step == 1)))
        pairs.append(pair)
        everyone = rank.gather_object([g.tolist() for g in kept])
        by_hand = [torch.tensor(a) + torch.tensor(b) for a, b in zip(*everyone)]
        steps.append({"equals_by_hand": all(torch.equal(a, b) for a, b in zip(views, by_hand)),
                      "shapes_kept": [list(v.shape) for v in views], "inputs_kept": all(
                          torch.equal(a, b) for a, b in zip(grads, kept)),
                      "in_the_buffer": [v.data_ptr() for v in views] == [
                          summed.flat.data_ptr() + 4 * o for o in (0, 6, 10)]})
    return {"steps": steps, "pairs": [p.tolist() for p in pairs]}


def main() -> None:
    rank = init_rank(process_group=sys.argv[2] if len(sys.argv) > 2 else "auto")
    report = {"rank": rank.rank, "size": rank.size, "local_rank": rank.local_rank, "local_size": rank.local_size,
              "device": rank.device, "process_group": rank.process_group, "rendezvous": rank.rendezvous,
              "collectives": collectives(rank), "buckets": buckets(rank), "flat_sum": flat_sum(rank),
              "allreduce": describe_allreduce(rank, gradient_bytes=4000, overlap=True, bucket_bytes=1000).to_dict(),
              "versions": {k: v for k, v in versions(rank).items() if k in ("process_group", "mpi_library", "mpi")}}
    rank.barrier()
    rank.close()
    Path(sys.argv[1], f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
