"""FireCaffe's Table 1 (batch 1024) and how our layer accounting compares with it."""
from __future__ import annotations

from dataclasses import dataclass

from firescale.model.layers import NetCost

# net: (|D| MB, |W| MB, forward+backward TFLOP per batch), all at batch 1024 (Iandola et al., Table 1).
FIRECAFFE_TABLE1 = {
    "nin": (5800.0, 30.0, 6.7),
    "alexnet": (1680.0, 249.0, 7.0),
    "googlenet": (19100.0, 54.0, 9.7),
    "vgg19": (42700.0, 575.0, 120.0),
}
TABLE1_BATCH = 1024


@dataclass(frozen=True)
class Table1Comparison:
    quantity: str
    unit: str
    ours: float
    published: float

    @property
    def difference_percent(self) -> float:
        return 100.0 * (self.ours - self.published) / self.published


def compare_table1(net: str, cost: NetCost) -> list[Table1Comparison] | None:
    """Ours beside Table 1 for |D|, |W| and FLOPs (|D| and FLOPs scaled to the cost's batch)."""
    if net not in FIRECAFFE_TABLE1:
        return None
    d_mb, w_mb, tflops = FIRECAFFE_TABLE1[net]
    scale = cost.batch / TABLE1_BATCH
    return [
        Table1Comparison("|D|", "MB", cost.activation_bytes / 1e6, d_mb * scale),
        Table1Comparison("|W|", "MB", cost.weight_bytes / 1e6, w_mb),
        Table1Comparison("fwd+bwd", "TFLOP", cost.training_flops / 1e12, tflops * scale),
    ]
