"""The `command` field of a plan: what `swift-vora train` would run for it.

There is one argv builder, the backends' (`build_launch`): `build_command` turns the plan's request into the recipe
it stands for (swift_vora/backends/planning.py) and returns the launch `train` would run for that recipe, as
`['env', 'K=V', ..., argv...]` so the list is directly executable, with `ANNOTATIONS.jsonl` standing in for the
dataset (`plan` has none). It returns [] for refused plans; a plan the launcher refuses or cannot express raises
`CommandRefused` with the launcher's reasons (select.py turns the plan into "refused").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List

if TYPE_CHECKING:  # pragma: no cover
    from .select import Plan, PlanRequest


class CommandRefused(Exception):
    """Raised when `swift-vora train` would refuse to launch the plan; the plan becomes "refused" with these
    reasons, so that `plan` and `train` never disagree."""

    def __init__(self, reasons: List[str]):
        super().__init__('; '.join(reasons))
        self.reasons = list(reasons)


def build_command(request: 'PlanRequest', plan: 'Plan') -> List[str]:
    if plan.verdict == 'refused' or not plan.backend:
        return []
    from ..backends.planning import plan_command  # imports neither torch nor ms-swift
    return [str(a) for a in plan_command(request, plan)]
