"""The time budget's plan as checkpoints and run_config.json record it."""

from __future__ import annotations

import dataclasses

from gptkit.train.budget import BudgetPlan


def test_a_plan_reads_back_as_it_was_written_and_as_earlier_versions_wrote_it():
    plan = BudgetPlan(time_budget_s=100.0, planned_steps=81, warmup_steps=0, seconds_per_update=1.0)
    replanned = dataclasses.replace(plan, replanned_at=(49,), seconds_per_update_later=1.2)
    for original in (plan, replanned):
        assert BudgetPlan.from_dict(original.to_dict()) == original
    # A warm-up of 0 is recorded; fields never set are not.
    assert plan.to_dict() == {
        "time_budget_s": 100.0,
        "planned_steps": 81,
        "warmup_steps": 0,
        "seconds_per_update": 1.0,
    }
    assert replanned.to_dict()["replanned_at"] == [49]
    # The plain dict of a checkpoint written before the plan had a type.
    earlier = {
        "time_budget_s": 3.0,
        "planned_steps": 3,
        "warmup_steps": 1,
        "stopped_at_deadline": True,
    }
    assert BudgetPlan.from_dict(earlier) == BudgetPlan(3.0, 3, 1, stopped_at_deadline=True)
