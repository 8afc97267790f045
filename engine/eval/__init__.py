"""`conductor eval`: the same tasks through the conductor and its baselines, one table."""

from conductor_engine.engine.eval.report import SystemRow, system_rows, write_report
from conductor_engine.engine.eval.systems import BASELINES, EvalSpec, eval_tasks

__all__ = ["BASELINES", "EvalSpec", "SystemRow", "eval_tasks", "system_rows", "write_report"]
