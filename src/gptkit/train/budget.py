"""A wall-clock budget for a run: time the first updates, plan the schedule for as many as fit,
re-plan as the pace changes, and stop at the deadline whatever happens.

The plan replaces ``max_steps`` and the warm-up (which keeps its share of the run); the learning
rate's schedule is laid over the planned updates, so the run ends with its decay complete. Updates
often slow down after the first (a CPU's caches warm, other work starts): the plan is measured
again halfway and at three quarters, still before a warm-up–stable–decay schedule starts its decay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gptkit.train.distributed import DistributedContext

PLAN_AFTER_UPDATES = 4  # updates timed (after the first) before a time budget is planned
REPLAN_AT = (0.5, 0.75)  # shares of the planned updates at which the pace is measured again
# A new plan within 2% (or 2 updates) of the current one is rounding, not a change of pace.
REPLAN_TOLERANCE = 0.02
RESERVE = 0.03  # of the budget, kept for checkpoints, the final evaluation and noise


class TimeBudget:
    """Plans ``max_steps`` (and the warm-up) of a run to fit ``seconds`` of wall-clock time.

    ``max_steps``/``warmup_for``: the configured bound and warm-up rule; ``time_evaluation``: runs one
    periodic evaluation and returns its seconds (None when evaluation is not periodic).
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
        self.plan: dict[str, Any] = {}
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
        time_evaluation: Callable[[], float] | None,
        evaluation_seconds: float = 0.0,
    ) -> dict[str, Any] | None:
        """Called after every update (``now``: when it ended; ``evaluation_seconds``: the run's
        evaluations so far, in all); returns the new plan when one is made, else None."""
        if self.timing_from is None:  # the first update pays for warm-up: time from its end
            self.timing_from = now
            return None
        if not self.plan:
            if step - self.first_step <= PLAN_AFTER_UPDATES:
                return None
            measured_over = step - self.first_step - 1
            pace = (now - self.timing_from) / measured_over
            if time_evaluation is not None:
                self.seconds_per_eval = time_evaluation()
                evaluation_seconds += self.seconds_per_eval
            elapsed = now - self.started + self.seconds_per_eval
            return self._plan(step, elapsed, pace, measured_over, evaluation_seconds)
        planned = self.plan["planned_steps"]
        if self.checks < len(REPLAN_AT) and step >= self.first_step + REPLAN_AT[self.checks] * (
            planned - self.first_step
        ):
            self.checks += 1
            from_step, from_time, from_evaluations = self.paced_from
            # The updates' own pace: evaluations since then are planned for separately.
            pace = (now - from_time - (evaluation_seconds - from_evaluations)) / (step - from_step)
            return self._plan(step, now - self.started, pace, step - from_step, evaluation_seconds, True)
        return None

    def _plan(
        self,
        step: int,
        elapsed: float,
        pace: float,
        measured_over: int,
        evaluations: float,
        replan: bool = False,
    ) -> dict:
        # Every process must plan the same number of updates: plan from the mean of their timings.
        timings = torch.tensor([pace, self.seconds_per_eval, elapsed], dtype=torch.float32)
        pace, per_eval, elapsed = self.ctx.all_reduce_mean(timings.to(self.ctx.device)).tolist()
        remaining = self.seconds * (1 - RESERVE) - elapsed - per_eval  # the final evaluation too
        per_update = pace + (per_eval / self.eval_every if self.eval_every else 0)
        planned = min(self.max_steps, step + max(int(remaining / per_update), 0))
        warmup = min(self.warmup_for(planned), planned)
        if replan:
            self.paced_from = (step, self.started + elapsed, evaluations)
            current = self.plan["planned_steps"]
            if abs(planned - current) <= max(REPLAN_TOLERANCE * current, 2):
                return None  # the pace held: the schedule stays as it is
            # A warm-up already under way keeps its length, so the rate does not jump back.
            warmup = self.plan["warmup_steps"] if step >= self.plan["warmup_steps"] else warmup
            history = [*self.plan.get("replanned_at", []), step]
            self.plan.update(planned_steps=planned, warmup_steps=warmup, replanned_at=history)
            self.plan["seconds_per_update_later"] = round(pace, 4)
        else:
            self.plan = {
                "time_budget_s": self.seconds,
                "seconds_per_update": round(pace, 4),
                "seconds_per_evaluation": round(per_eval, 4),
                "planned_steps": planned,
                "warmup_steps": warmup,
            }
        self.measured_over = measured_over
        self.paced_from = (step, self.started + elapsed, evaluations)
        return self.plan

    def message(self) -> str:
        plan = self.plan
        if plan.get("replanned_at"):
            return (
                f"time budget {self.label}: {plan['seconds_per_update_later']:.2f}s per update lately → "
                f"{plan['planned_steps']} updates planned"
            )
        return (
            f"time budget {self.label}: {plan['seconds_per_update']:.2f}s per update measured over "
            f"{self.measured_over} updates → {plan['planned_steps']} updates planned (warm-up {plan['warmup_steps']})"
        )

    def past_deadline(self, now: float) -> bool:
        """Whether any process is past the budget: all of them stop at the same update."""
        past = self.elapsed(now) >= self.seconds
        if not self.ctx.is_distributed:
            return past
        flag = torch.tensor([1.0 if past else 0.0], device=self.ctx.device)
        return bool(self.ctx.all_reduce_mean(flag).item() > 0)

    def stop_here(self, step: int, warmup_steps: int) -> dict[str, Any]:
        """The run ends at ``step`` (the deadline came first): record it as complete."""
        self.plan.update(
            time_budget_s=self.seconds,
            planned_steps=step,
            warmup_steps=warmup_steps,
            stopped_at_deadline=True,
        )
        return self.plan
