"""A wall-clock budget for a run: time the first updates, plan the schedule for as many as fit,
re-plan as the pace changes, and stop at the deadline whatever happens.

The plan replaces ``max_steps`` and the warm-up (which keeps its share of the run); the learning
rate's schedule is laid over the planned updates, so the run ends with its decay complete. Updates
often slow down after the first (a CPU's caches warm, other work starts): the plan is measured
again halfway and at three quarters, still before a warm-up–stable–decay schedule starts its decay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gptkit.train.distributed.processes import DistributedContext

PLAN_AFTER_UPDATES = 4  # updates timed (after the first) before a time budget is planned
REPLAN_AT = (0.5, 0.75)  # shares of the planned updates at which the pace is measured again
# A new plan within 2% (or 2 updates) of the current one is rounding, not a change of pace.
REPLAN_TOLERANCE = 0.02
RESERVE = 0.03  # of the budget, kept for checkpoints, the final evaluation and noise


@dataclass(frozen=True)
class BudgetPlan:
    """A time budget's plan: the run's updates and warm-up, and the pace they were planned for.

    The training loop's one record of it: its schedule follows the plan, and every checkpoint saves
    it (as :meth:`to_dict`, also ``run_config.json``'s ``resolved.time_budget_plan``), so that a
    resumed run keeps its schedule.
    """

    time_budget_s: float
    planned_steps: int  # the run's last update
    warmup_steps: int
    seconds_per_update: float | None = None  # measured before the first plan (None: no plan was made)
    seconds_per_evaluation: float | None = None
    replanned_at: tuple[int, ...] = ()  # updates at which a new pace changed the plan
    seconds_per_update_later: float | None = None  # the pace of the latest new plan
    stopped_at_deadline: bool = False  # the deadline came first: the run ended at planned_steps

    def to_dict(self) -> dict[str, Any]:
        """The fields that were set, as JSON values."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["replanned_at"] = list(self.replanned_at)
        # Unset fields are left out, as in the plain dicts of earlier versions (`is`: a warm-up of 0 is set).
        return {
            name: value
            for name, value in values.items()
            if not (value is None or value is False or value == [])
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BudgetPlan:
        """The plan :meth:`to_dict` gave (checkpoints of earlier versions wrote the same keys)."""
        known = {f.name for f in dataclasses.fields(cls)}
        plan = {name: value for name, value in values.items() if name in known}
        return cls(**{**plan, "replanned_at": tuple(plan.get("replanned_at", ()))})


class TimeBudget:
    """Plans ``max_steps`` (and the warm-up) of a run to fit ``seconds`` of wall-clock time.

    The pace it measures is its own; the plan it makes is the caller's, which hands it back with
    every update (one :class:`BudgetPlan`, saved in the checkpoints). ``max_steps``/``warmup_for``:
    the configured bound and warm-up rule; ``time_evaluation``: runs one periodic evaluation and
    returns its seconds (None when evaluation is not periodic).
    """

    def __init__(
        self,
        seconds: float,
        label: str,
        max_steps: int,
        warmup_for: Callable[[int], int],
        eval_every: int,
        ctx: DistributedContext,
        clock: Callable[[], float],
    ):
        self.seconds, self.label, self.max_steps = seconds, label, max_steps
        self.warmup_for, self.eval_every, self.ctx, self.clock = warmup_for, eval_every, ctx, clock
        self.started = self.timing_from = None
        self.first_step = 0
        # (step, time, evaluation seconds so far) that the next pace is measured from
        self.paced_from: tuple[int, float, float] = (0, 0.0, 0.0)
        self.seconds_per_eval = 0.0
        self.measured_over = 0
        self.checks = 0  # paces measured again so far

    def start(self, step: int) -> None:
        self.started, self.first_step = self.clock(), step

    def elapsed(self, now: float) -> float:
        return now - self.started

    def after_update(
        self,
        step: int,
        now: float,
        plan: BudgetPlan | None,
        time_evaluation: Callable[[], float] | None,
        evaluation_seconds: float = 0.0,
    ) -> BudgetPlan | None:
        """Called after every update with the current plan (``now``: when the update ended;
        ``evaluation_seconds``: the run's evaluations so far, in all); returns a new plan when one
        is made, else None."""
        if self.timing_from is None:  # the first update pays for warm-up: time from its end
            self.timing_from = now
            return None
        if plan is None:
            if step - self.first_step <= PLAN_AFTER_UPDATES:
                return None
            measured_over = step - self.first_step - 1
            pace = (now - self.timing_from) / measured_over
            if time_evaluation is not None:
                self.seconds_per_eval = time_evaluation()
                evaluation_seconds += self.seconds_per_eval
            elapsed = now - self.started + self.seconds_per_eval
            return self._first_plan(step, elapsed, pace, measured_over, evaluation_seconds)
        if self.checks < len(REPLAN_AT) and step >= self.first_step + REPLAN_AT[self.checks] * (
            plan.planned_steps - self.first_step
        ):
            self.checks += 1
            from_step, from_time, from_evaluations = self.paced_from
            # The updates' own pace: evaluations since then are planned for separately.
            pace = (now - from_time - (evaluation_seconds - from_evaluations)) / (step - from_step)
            return self._replan(plan, step, now - self.started, pace, step - from_step, evaluation_seconds)
        return None

    def _updates_that_fit(self, step: int, elapsed: float, pace: float) -> tuple[int, float, float, float]:
        """(the last update that fits, pace, seconds per evaluation, elapsed), the same on every process."""
        # Every process must plan the same number of updates: plan from the mean of their timings.
        timings = torch.tensor([pace, self.seconds_per_eval, elapsed], dtype=torch.float32)
        pace, per_eval, elapsed = self.ctx.all_reduce_mean(timings.to(self.ctx.device)).tolist()
        remaining = self.seconds * (1 - RESERVE) - elapsed - per_eval  # the final evaluation too
        per_update = pace + (per_eval / self.eval_every if self.eval_every else 0)
        return min(self.max_steps, step + max(int(remaining / per_update), 0)), pace, per_eval, elapsed

    def _first_plan(
        self, step: int, elapsed: float, pace: float, measured_over: int, evaluations: float
    ) -> BudgetPlan:
        planned, pace, per_eval, elapsed = self._updates_that_fit(step, elapsed, pace)
        self.measured_over = measured_over
        self.paced_from = (step, self.started + elapsed, evaluations)
        return BudgetPlan(
            time_budget_s=self.seconds,
            planned_steps=planned,
            warmup_steps=min(self.warmup_for(planned), planned),
            seconds_per_update=round(pace, 4),
            seconds_per_evaluation=round(per_eval, 4),
        )

    def _replan(
        self, plan: BudgetPlan, step: int, elapsed: float, pace: float, measured_over: int, evaluations: float
    ) -> BudgetPlan | None:
        planned, pace, _, elapsed = self._updates_that_fit(step, elapsed, pace)
        self.paced_from = (step, self.started + elapsed, evaluations)
        if abs(planned - plan.planned_steps) <= max(REPLAN_TOLERANCE * plan.planned_steps, 2):
            return None  # the pace held: the schedule stays as it is
        # A warm-up already under way keeps its length, so the rate does not jump back.
        warmup = plan.warmup_steps if step >= plan.warmup_steps else min(self.warmup_for(planned), planned)
        self.measured_over = measured_over
        return dataclasses.replace(
            plan,
            planned_steps=planned,
            warmup_steps=warmup,
            replanned_at=(*plan.replanned_at, step),
            seconds_per_update_later=round(pace, 4),
        )

    def message(self, plan: BudgetPlan) -> str:
        if plan.replanned_at:
            return (
                f"time budget {self.label}: {plan.seconds_per_update_later:.2f}s per update lately → "
                f"{plan.planned_steps} updates planned"
            )
        return (
            f"time budget {self.label}: {plan.seconds_per_update:.2f}s per update measured over "
            f"{self.measured_over} updates → {plan.planned_steps} updates planned (warm-up {plan.warmup_steps})"
        )

    def past_deadline(self, now: float, agreed: bool) -> bool:
        """Whether the run is past the budget: alone, at ``now``; under torchrun, as the update's
        shared values said (``agreed``: any process was past it when they were reduced), so that
        every process stops at the same update without a collective of its own."""
        if not self.ctx.is_distributed:
            return self.elapsed(now) >= self.seconds
        return agreed

    def stop_here(self, plan: BudgetPlan | None, step: int, warmup_steps: int) -> BudgetPlan:
        """The run ends at ``step`` (the deadline came first): ``plan``, or none yet, recorded as complete."""
        ended = {"planned_steps": step, "warmup_steps": warmup_steps, "stopped_at_deadline": True}
        if plan is None:
            return BudgetPlan(time_budget_s=self.seconds, **ended)
        return dataclasses.replace(plan, **ended)
