"""The physical ceiling: model architecture, hardware specs, memory plan and decode/prefill
ceilings, before launch and as "% of limit" during a run (see ``plan.py``)."""

from app.planner.arch import ModelArch, PlannerError, load_arch
from app.planner.plan import Plan, make_plan, percent_of_ceiling

__all__ = ["ModelArch", "Plan", "PlannerError", "load_arch", "make_plan", "percent_of_ceiling"]
