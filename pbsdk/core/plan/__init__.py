"""The analytical cost model: pure functions from (ChipSpec, op) to frozen plans. No IR here."""

from pbsdk.core.plan.contraction import (
    ComputeTile,
    Contraction,
    ContractionPlan,
    Estimate,
    LevelTile,
    plan_contraction,
)
from pbsdk.core.plan.explain import explain_graph, format_plan

__all__ = ["ComputeTile", "Contraction", "ContractionPlan", "Estimate", "LevelTile", "explain_graph",
           "format_plan", "plan_contraction"]
