"""A sweep point predicted as it trains: phase by phase when its batch changes, one device per replica."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from firescale.model.paleo import Platform, Prediction, predict_point
from firescale.nets.spec import NetSpec
from firescale.sweep.points import SweepPoint, phase_images


def predict_phases(platform: Platform, net: NetSpec, point: SweepPoint, epochs: float, dataset_size: int,
                   **options: Any) -> Prediction:
    """Paleo's prediction of `point` training `epochs`: without a schedule, one predict_point; with one,
    each phase at its batch for the images it trains (phase_images), summed.  A replica split over
    devices by a layer plan counts as one device running its layers in turn (the copies between its
    devices are left out: `firescale predict split` models them from a measured run).  The result is the first
    phase's prediction with the whole run's epochs, iterations and time, and their mean iteration time."""
    phases = [(batch, images) for batch, images in phase_images(point, epochs * dataset_size) if images > 0]
    preds = [predict_point(platform, net, point.ranks, batch, epochs=images / dataset_size,
                           dataset_size=dataset_size, **options) for batch, images in phases]
    if len(preds) == 1 and not point.schedule:
        return preds[0]
    iterations = sum(p.iterations for p in preds)
    time_s = sum(p.time_to_accuracy_s for p in preds)
    return replace(preds[0], epochs=sum(p.epochs for p in preds), iterations=iterations,
                   time_to_accuracy_s=time_s, iteration_s=time_s / iterations)
