"""Horovod set-up for one rank: init, device and thread pinning, determinism, sums, and the allreduce in use."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from firescale.cluster.horovod import recorded_knobs
from firescale.cluster.horovod_build import collectives_record
from firescale.errors import FirescaleError
from firescale.train.host import mpi_implementation, pin_cpus
from firescale.train.ranks import AllreduceRecord, RankBasics, allreduce_settings, stack_versions

T = TypeVar("T")


@dataclass
class Rank(RankBasics):
    """A Horovod rank (train/ranks.py): its collectives of several ranks are Horovod's."""

    hvd: Any

    def _sum(self, tensors: list[Any]) -> list[Any]:
        """Element-wise sums over all ranks of each tensor (one grouped Horovod allreduce, op=Sum)."""
        return list(self.hvd.grouped_allreduce(tensors, op=self.hvd.Sum))

    def sum_each(self, tensors: Sequence[Any]) -> list[Any]:
        """Element-wise sums over all ranks, one Horovod allreduce (op=Sum) per tensor and no group: inside a
        graph each is handed to Horovod as soon as its tensor exists (the op is not stateful, so nothing
        orders it after the others), as DistributedGradientTape does, and early ones run while the rest
        of the graph computes.  Horovod still fuses those that reach one of its cycles together."""
        if self.size == 1:
            return list(tensors)
        return [self.hvd.allreduce(t, op=self.hvd.Sum) for t in tensors]

    def _sum_numbers(self, array: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        return np.asarray(self.hvd.allreduce(tf.constant(array), op=self.hvd.Sum).numpy())

    def _barrier(self) -> None:
        self._sum_numbers(np.zeros(1))

    def broadcast_variables(self, variables: Sequence[Any]) -> None:
        if self.size > 1:
            self.hvd.broadcast_variables(list(variables), root_rank=0)

    def _broadcast_object(self, obj: T) -> T:
        return cast(T, self.hvd.broadcast_object(obj, root_rank=0))

    def _gather_object(self, obj: T) -> list[T]:
        return list(self.hvd.allgather_object(obj))


def init_rank(threads: int = 1, devices: int = 1) -> Rank:
    """hvd.init(), `devices` devices per local rank (one, or a replica's when its net is split by layers),
    `threads` TF threads per rank, deterministic ops.

    On GPUs local rank r takes GPUs r*devices .. (r+1)*devices - 1; on a CPU it splits its core into
    `devices` logical devices, which stand in for them.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        first = hvd.local_rank() * devices
        if first + devices > len(gpus) and devices > 1:
            raise FirescaleError(f"local rank {hvd.local_rank()} needs GPUs {first} to {first + devices - 1} for its "
                                 f"split net, but this node shows {len(gpus)}")
        mine = [gpus[(first + i) % len(gpus)] for i in range(devices)]
        tf.config.set_visible_devices(mine, "GPU")
        for gpu in mine:
            tf.config.experimental.set_memory_growth(gpu, True)
        device, pinned = f"GPU:{first % len(gpus)}", []
        names = tuple(f"/device:GPU:{i}" for i in range(devices))
    else:
        pinned = pin_cpus(hvd.local_rank(), hvd.local_size())
        device = "CPU:0"
        if devices > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
        names = tuple(f"/device:CPU:{i}" for i in range(devices))
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.experimental.enable_op_determinism()
    return Rank(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), device, pinned, hvd,
                devices=names if devices > 1 else ())


HOROVOD_FUSION_THRESHOLD = 64 * 1024 * 1024   # bytes Horovod fuses into one allreduce unless told otherwise


def describe_allreduce(rank: Rank, env: Mapping[str, str] | None = None, *,
                       gradient_bytes: int | None = None, overlap: bool = False) -> AllreduceRecord:
    """Which allreduce summed the gradients: what the job asked for (FIRESCALE_ALLREDUCE), the library that
    carried them (NCCL, Open MPI, MPICH or Gloo) and the algorithm its settings select, decoded by the
    same vocabulary that set them (firescale.cluster.collectives), with the cost model of it; and whether
    each gradient's allreduce overlapped the backward pass (`overlap`) or one grouped one followed it."""
    env = dict(os.environ if env is None else env)
    hvd = rank.hvd
    controller = "mpi" if hvd.mpi_enabled() else ("gloo" if hvd.gloo_enabled() else "none")
    cpu_ops = env.get("HOROVOD_CPU_OPERATIONS", "").lower() or controller
    if rank.device.startswith("GPU") and hvd.nccl_built():
        library = "nccl"
    elif cpu_ops == "gloo":
        library = "gloo"
    else:
        library = mpi_implementation() if rank.size > 1 else "none"
    message = None
    if gradient_bytes is not None:
        message = min(int(gradient_bytes), int(env.get("HOROVOD_FUSION_THRESHOLD", HOROVOD_FUSION_THRESHOLD)))
    return AllreduceRecord(controller=controller, cpu_operations=cpu_ops, horovod_knobs=recorded_knobs(env),
                           collectives=collectives_record(hvd, rank.device),   # Horovod's own facts for the library
                           **allreduce_settings(env, rank, library=library, message_bytes=message,
                                                overlap=overlap))


def versions() -> dict[str, str | None]:
    """Versions of the stack that produced a result, TensorFlow's and Horovod's among them."""
    import tensorflow as tf

    own: dict[str, str | None] = {"tensorflow": tf.__version__}
    try:
        import horovod

        own["horovod"] = horovod.__version__
    except ImportError:  # pragma: no cover - horovod is part of the stack
        pass
    return stack_versions(own)
