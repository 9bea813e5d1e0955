"""Batch-size arithmetic: prompts and samples per step, per-rank shards, mini- and micro-batches."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlhfctl.data.records import count_records
from rlhfctl.recipe.dataflow import training_step
from rlhfctl.recipe.pools import PoolInfo, pool_of
from rlhfctl.recipe.errors import Issue, error
from rlhfctl.recipe.resolve import samples_per_rank
from rlhfctl.recipe.specs import Recipe
from rlhfctl.single_controller.rows import RowLayout
from rlhfctl.trainer.prompt_source import source_records

__all__ = ["BatchTable", "EpochRow", "ShardRow", "UpdateRow", "derive_batch_table"]


@dataclass(frozen=True)
class ShardRow:
    """How one group call's rows split over its ranks (ALL_TO_ALL), padding included."""

    call: str
    role: str
    pool: str
    world_size: int
    rows: int
    unit: str
    rows_per_rank: int
    padding: int
    rows_out: int


@dataclass(frozen=True)
class UpdateRow:
    """How an updating role (actor, critic) cuts its per-rank shard into mini- and micro-batches."""

    role: str
    world_size: int
    mini_batch_size: int
    mini_batches: int | None
    mini_batch_samples: int
    rows_per_rank: int
    padding: int
    mini_batch_rows_per_rank: int | None
    micro_batch_size: int | None
    grad_accum: int | None
    ppo_epochs: int
    optimizer_steps: int | None


@dataclass(frozen=True)
class EpochRow:
    """How the training prompts fill steps: whole batches only, so a partial last batch is left out."""

    prompts: int
    """Records in data.train_files (before overlong prompts are skipped), or data.num_train for a task."""
    steps_per_epoch: int
    dropped_per_epoch: int
    """The last ``prompts % batch_size`` prompts of each epoch's order, not trained on in that epoch."""
    shuffled: bool
    """data.shuffle: each epoch leaves out different prompts; without it, always the same last ones."""


@dataclass(frozen=True)
class BatchTable:
    """The derived numbers of one training step."""

    prompts_per_step: int
    n: int
    samples_per_step: int
    shards: tuple[ShardRow, ...]
    updates: tuple[UpdateRow, ...]
    epoch: EpochRow | None = None
    engine: str = "hf"  # rollout.engine: who samples the responses

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "prompts_per_step": self.prompts_per_step,
            "n": self.n,
            "samples_per_step": self.samples_per_step,
            "shards": [asdict(row) for row in self.shards],
            "updates": [asdict(row) for row in self.updates],
            "epoch": asdict(self.epoch) if self.epoch is not None else None,
            "engine": self.engine,
        }


def derive_batch_table(recipe: Recipe, batch_size: int | None = None) -> tuple[BatchTable, list[Issue]]:
    """The step's batch numbers for ``batch_size`` prompts (default trainer.batch_size), and the problems found."""
    prompts = int(batch_size if batch_size is not None else recipe.trainer.batch_size)
    n = int(recipe.rollout.settings.n)
    samples = prompts * n
    pools = recipe.pools
    shards = []
    for call in training_step(recipe):
        pool = pool_of(pools, call.role)
        if call.role == "driver" or pool is None or not call.carries_rows:
            continue
        rows = prompts if call.unit == "prompts" else samples
        layout = RowLayout(rows, pool.world_size)
        shards.append(ShardRow(call.name, call.role, pool.name, pool.world_size, rows, call.unit,
                               layout.shard_size, layout.pad, rows * call.fan_out))
    updates, issues = [], []
    for role in ("critic", "actor"):
        pool = pool_of(pools, role)
        if pool is not None:
            row, found = _update_row(recipe, role, pool, prompts, samples)
            updates.append(row)
            issues.extend(found)
    return BatchTable(prompts, n, samples, tuple(shards), tuple(updates), _epoch_row(recipe, prompts),
                      recipe.rollout.engine), issues


def _epoch_row(recipe: Recipe, prompts_per_step: int) -> EpochRow | None:
    """Steps per epoch and the prompts the partial last batch leaves out; None when the data cannot be read
    (check_data reports why) or there is less than one batch of it."""
    prompts = _training_prompts(recipe)
    if not prompts or prompts < prompts_per_step:
        return None
    steps, dropped = divmod(prompts, prompts_per_step)
    return EpochRow(prompts, steps, dropped, bool(recipe.data.shuffle))


def _training_prompts(recipe: Recipe) -> int | None:
    """The training records: counted from the files' metadata or lines where that works (large verl
    parquets stay fast), else read; None when the data cannot be read."""
    files = recipe.data.train_files
    if files:
        counts = [count_records(str(name)) for name in ([files] if isinstance(files, str) else files)]
        if all(count is not None for count in counts):
            return sum(counts)
    try:
        records = source_records(recipe, "train")
    except ValueError:  # DataFileError, UnknownTaskError: reported by check_data
        return None
    return None if records is None else len(records)


def _update_row(recipe: Recipe, role: str, pool: PoolInfo, prompts: int, samples: int) -> tuple[UpdateRow, list[Issue]]:
    """Mini-batch = mini_batch_size prompts x n samples, split evenly over the ranks; micro-batches cut each rank's part."""
    update = recipe.step.updates[role]
    n = int(recipe.rollout.settings.n)
    mb_key, mini_batch, epochs = update.mini_batch_key, update.mini_batch_size, update.ppo_epochs
    world = pool.world_size
    layout = RowLayout(samples, world)
    per_rank = layout.shard_size
    issues: list[Issue] = []
    mini_batches = mini_rows = micro = accum = None
    if mini_batch > prompts:
        issues.append(error(mb_key, f"{mb_key}: {mini_batch} prompts is larger than trainer.batch_size ({prompts}); a mini-batch is part of a step's batch"))
    elif prompts % mini_batch:
        issues.append(error(mb_key, (
            f"{mb_key}: trainer.batch_size {prompts} is not divisible by the {role} mini-batch size {mini_batch}; "
            f"use a divisor of {prompts}"
        )))
    elif (mini_batch * n) % world:
        issues.append(error(mb_key, (
            f"{mb_key}: the {role}'s mini-batch of {mini_batch * n} samples ({mini_batch} prompts x n={n}) does not split "
            f"evenly over {world} ranks; make mini_batch_size x rollout.n a multiple of {world}"
        )))
    else:
        mini_batches = prompts // mini_batch
        mini_rows = samples_per_rank(mini_batch, n, world, per_rank)
    micro_key = f"roles.{role}.micro_batch_size"
    if mini_rows is not None:
        micro = update.micro_batch_size if update.micro_batch_size is not None else mini_rows
        if micro > mini_rows:
            issues.append(error(micro_key, (
                f"{micro_key}: {micro} is larger than one mini-batch on one rank ({mini_rows} rows = "
                f"{mini_batch} prompts x n={n} / {world} ranks)"
            )))
        elif mini_rows % micro:
            issues.append(error(micro_key, (
                f"{micro_key}: a mini-batch on one rank has {mini_rows} rows, not divisible by micro_batch_size {micro}; "
                f"use a divisor of {mini_rows}"
            )))
        else:
            accum = mini_rows // micro
    row = UpdateRow(
        role=role,
        world_size=world,
        mini_batch_size=mini_batch,
        mini_batches=mini_batches,
        mini_batch_samples=mini_batch * n,
        rows_per_rank=per_rank,
        padding=layout.pad,
        mini_batch_rows_per_rank=mini_rows,
        micro_batch_size=micro,
        grad_accum=accum,
        ppo_epochs=epochs,
        optimizer_steps=None if mini_batches is None else mini_batches * epochs,
    )
    return row, issues
