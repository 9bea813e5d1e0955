"""``rlhfctl pipeline``: run RLHF stages (sft, reward model, ppo, dpo) in order, each feeding the next."""

from __future__ import annotations

from typing import List, Optional

import typer

from rlhfctl.cli.console import make_console
from rlhfctl.cli.errors import guarded

__all__ = ["pipeline"]


def pipeline(
    pipeline_file: str = typer.Argument(..., metavar="PIPELINE", show_default=False,
                                        help="pipeline YAML file, or the name of a bundled one (pipeline-quickstart)"),
    overrides: Optional[List[str]] = typer.Argument(
        None, show_default=False, help="output_dir=DIR, or STAGE.KEY=value for a recipe key of one stage (sft.trainer.total_steps=10)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
) -> None:
    """Run the stages of PIPELINE in order: each is a recipe plus overrides, and later stages load
    earlier stages' models through `${stages.NAME.output}`.

    Every stage writes `OUTPUT_DIR/STAGE/` (metrics.jsonl, model/, COMPLETE when it finished). All
    recipes are loaded and validated first (exit 2 on a problem, naming the stage and key). On a rerun,
    stages already complete with the same recipe are skipped; a stage that runs again makes the later
    ones run again too. See docs/pipeline.md.

    Examples:

      rlhfctl pipeline recipes/pipeline-quickstart.yaml output_dir=runs/rlhf

      rlhfctl pipeline pipeline-quickstart output_dir=runs/rlhf ppo.trainer.total_steps=60

      rlhfctl pipeline my-pipeline.yaml sft.data.train_files=[demos.jsonl] --quiet

    Exit codes: 0 done, 1 internal error, 2 pipeline/recipe/data/model error, 130 interrupted.
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.cli.pipeline_view import make_pipeline_view
        from rlhfctl.cli.recipe_args import resolve_recipe_path
        from rlhfctl.pipeline import load_pipeline, run_pipeline

        spec = load_pipeline(resolve_recipe_path(pipeline_file), list(overrides or []))
        with make_pipeline_view(quiet, console) as view:
            run_pipeline(spec, view)
