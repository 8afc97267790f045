"""`conductor eval`: the same tasks through the conductor and its baselines, one table."""

from conductor_engine.engine.eval.report import SystemRow, system_rows, write_report
from conductor_engine.engine.eval.run import EvalClient, EvalOutcome, run_eval, wait_for_batch
from conductor_engine.engine.eval.systems import BASELINES, EvalSpec, eval_tasks
from conductor_engine.engine.eval.usable import EvalAgents, eval_agents

__all__ = ["BASELINES", "EvalAgents", "EvalClient", "EvalOutcome", "EvalSpec", "SystemRow",
           "eval_agents", "eval_tasks", "run_eval", "system_rows", "wait_for_batch",
           "write_report"]
