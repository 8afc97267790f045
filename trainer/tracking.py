"""Each update's metrics where ML people look: TensorBoard and/or trackio (the recipe's
`report_to`).

The trainer service logs once an update has published, because it alone holds the figures (the
rollouts' reward and valid plan rate, the step's loss, KL, clip fraction, grad norm, tokens/s)
and the plans it trained on; the training workflow stays free of I/O. A run is named after its
training run (`conductor train start --name NAME`, read back from the update's idempotency key),
its step is the iteration; TensorBoard's files go to data_dir/runs/NAME on the trainer's
machine. Tracking never fails an update: a tracker that cannot write says so in one log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from conductor_engine.engine.contracts.names import update_of
from conductor_engine.engine.contracts.training import Tracker, UpdateRequest

log = structlog.get_logger(__name__)

SAMPLE_PLANS = 3  # plans shown per iteration: the first rollout of the first groups
SAMPLE_CHARS = 2000
INSTALL = {"tensorboard": "pip install 'conductor-engine[train]' (tensorboard)",
           "trackio": "pip install 'conductor-engine[trackio]'"}


@dataclass
class SamplePlan:
    task_id: str
    reward: float | None
    text: str


@dataclass
class Iteration:
    """What one update is logged as: its run, its step, scalars and sample plans."""

    run: str
    step: int
    scalars: dict[str, float]
    samples: list[SamplePlan] = field(default_factory=list)


def iteration_of(req: UpdateRequest, metrics: dict[str, Any],
                 samples: list[SamplePlan]) -> Iteration:
    """The logged form of one published update. Tags follow TRL's (`train/reward`, ...), so a
    dashboard made for TRL runs reads these too."""
    named = update_of(req.update_id)
    run, step = named if named else (req.name, req.parent)  # an update requested by hand
    seconds = float(metrics.get("seconds") or 0.0)
    figures: dict[str, Any] = {
        "train/reward": metrics.get("mean_reward"),
        "train/valid_plan_rate": metrics.get("valid_plan_rate"),
        "train/loss": metrics.get("loss"),
        "train/kl": metrics.get("kl"),
        "train/clip_fraction": metrics.get("clip_fraction"),
        "train/grad_norm": metrics.get("grad_norm"),
        "train/tokens_per_s": metrics.get("tokens", 0) / seconds if seconds > 0 else None,
        "train/trained_tokens": metrics.get("tokens"),
        "train/rollout_tokens": metrics.get("rollout_tokens"),
        "train/rollouts": metrics.get("rollouts"),
        "train/groups": metrics.get("groups"),
        "train/learning_rate": req.recipe.loss.learning_rate,
        "train/policy_version": req.parent + 1,
        "train/update_seconds": seconds,
        **{f"left_out/{reason}": n for reason, n in (metrics.get("left_out") or {}).items()},
    }
    scalars = {k: float(v) for k, v in figures.items() if isinstance(v, int | float)}
    return Iteration(run=run, step=step, scalars=scalars, samples=samples)


class Trackers:
    """The trackers of one trainer process: one open writer per run and tracker."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "runs"
        self._tensorboard: dict[str, Any] = {}
        self._trackio: dict[str, Any] = {}
        self._missing: set[Tracker] = set()  # said once per process

    def log(self, report_to: list[Tracker], it: Iteration) -> None:
        for tracker in report_to:
            try:
                (self._to_tensorboard if tracker == "tensorboard" else self._to_trackio)(it)
            except ImportError:
                if tracker not in self._missing:
                    self._missing.add(tracker)
                    log.error(f"report_to {tracker}: not installed on this trainer; "
                              f"{INSTALL[tracker]}, or leave it out of the recipe")
            except Exception as e:  # a full disk, a tracker's server: never fail the update
                log.warning("training metrics not logged", tracker=tracker, run=it.run,
                            step=it.step, error=f"{type(e).__name__}: {e}")

    def _to_tensorboard(self, it: Iteration) -> None:
        writer = self._tensorboard.get(it.run)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            writer = self._tensorboard[it.run] = SummaryWriter(log_dir=str(self.root / it.run))
        for tag, value in it.scalars.items():
            writer.add_scalar(tag, value, it.step)
        if it.samples:
            writer.add_text("sample_plans", _markdown(it.samples), it.step)
        writer.flush()

    def _to_trackio(self, it: Iteration) -> None:
        run = self._trackio.get(it.run)
        if run is None:
            import trackio

            run = self._trackio[it.run] = trackio.init(project="conductor", name=it.run,
                                                       resume="allow")
        texts = {"sample_plans": _markdown(it.samples)} if it.samples else {}
        run.log({**it.scalars, **texts}, step=it.step)

    def close(self) -> None:
        for writer in self._tensorboard.values():
            writer.close()
        for run in self._trackio.values():
            run.finish()
        self._tensorboard.clear()
        self._trackio.clear()


def _markdown(samples: list[SamplePlan]) -> str:
    """Sample plans as TensorBoard's text plugin shows them (Markdown)."""
    parts = []
    for s in samples:
        reward = "no reward" if s.reward is None else f"reward {s.reward:g}"
        text = s.text if len(s.text) <= SAMPLE_CHARS else s.text[:SAMPLE_CHARS] + " …"
        parts.append(f"**{s.task_id}** ({reward})\n\n    " + text.replace("\n", "\n    "))
    return "\n\n".join(parts)
