"""Horovod's negotiation cycle: how long an iteration's allreduce waits for the background thread's next cycle.

Horovod (0.28.1, `horovod/common/operations.cc`, `RunLoopOnce`) reduces nothing when a rank asks: the
request joins a queue, and a background thread takes the queue once per cycle.  Each cycle begins by
sleeping until `last_cycle_start + HOROVOD_CYCLE_TIME` (1 ms unless set), then sets `last_cycle_start`
to now, agrees with the other ranks which requests every rank has made (the response cache's bit
vectors, one small collective), and performs those.  A request made just after a cycle began waits
almost a whole cycle; one made just before it, nothing.

The cycles are timed from the start of the cycle that performed the previous allreduce, so what matters
is `work`: the iteration's time without the wait, from that start to the next request (the compute of
the next iteration and the allreduce itself).

- `work` shorter than a cycle: the next request is in before the next cycle begins, every time.  The
  iteration is one cycle; the wait is the rest of it, `cycle - work`.
- `work` of a cycle or more: the request falls somewhere in a later cycle.  Where is not fixed: the
  compute's own jitter, the sleep's overshoot (the kernel's timer slack) and each rank's thread keeping
  its own timer (the collective that joins them only holds the earlier one back) move it by as much as a
  cycle from one iteration to the next.  The phase is taken as uniform over the cycle, so the wait is
  half a cycle on average.

No factor is fitted: the cycle time is the site's (`horovod.cycle_time_ms`, else Horovod's default).
"""
from __future__ import annotations

import math

from firescale.errors import FirescaleError


def _check(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise FirescaleError(f"{name} must be a number of seconds >= 0, not {value}")


def cycle_wait(work_s: float, cycle_s: float) -> float:
    """Expected seconds an iteration's allreduce request waits for the cycle that negotiates it, when the
    iteration's work without that wait (compute and allreduce) takes `work_s` and a cycle `cycle_s`."""
    _check("the iteration's work", work_s)
    _check("the cycle time", cycle_s)
    if work_s < cycle_s:
        return cycle_s - work_s     # paced by the cycle: one iteration per cycle
    return cycle_s / 2              # the request's phase in the cycle uniform


def allreduce_without_wait(measured_s: float, step_s: float, cycle_s: float) -> tuple[float, bool]:
    """The allreduce's own seconds in a measurement that includes the cycle wait (Horovod's allreduce after
    a step of `step_s`, `measured_s` more than the step), and whether the measurement determines it.

    Solves measured = allreduce + cycle_wait(step + allreduce, cycle).  When step + measured reaches
    1.5 cycles the request fell in a later cycle and the answer is measured - cycle / 2.  Below that the
    iteration ran at one per cycle: any allreduce up to cycle - step gives the same measurement; the
    flag is then False (and measured - cycle / 2, at least 0, is returned from that range).
    """
    _check("the measured allreduce", measured_s)
    _check("the step", step_s)
    _check("the cycle time", cycle_s)
    determined = step_s + measured_s >= 1.5 * cycle_s
    return max(0.0, measured_s - cycle_s / 2), determined
