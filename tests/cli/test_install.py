"""A plain (non-editable) install works from any directory: the wheel ships the recipes and the default workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(command: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A wheel built from this checkout, installed (--no-deps) into a fresh venv that reuses this venv's packages."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # a copy: building in place would leave build/ and *.egg-info in the checkout
    for name in ("pyproject.toml", "setup.py", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for name in ("rlhfctl", "workers", "recipes"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
         str(source)], cwd=root)
    wheel = next((root / "dist").glob("rlhfctl-*.whl"))
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    python = venv / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    # The fresh venv sees this venv's third-party packages (torch, ray, ...) after its own site-packages.
    (Path(site) / "reuse_test_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], cwd=root)
    return venv


def test_the_wheel_holds_the_recipes_and_the_default_workers(installed):
    wheel = next((installed.parent / "dist").glob("rlhfctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for recipe in (REPO / "recipes").glob("*.yaml"):
        assert f"rlhfctl/recipes_bundled/{recipe.name}" in names
    assert "workers/actor.py" in names and "workers/reward.py" in names


@pytest.mark.slow
def test_recipes_list_copy_and_train_quickstart_work_from_any_directory(installed, tmp_path):
    rlhfctl = str(installed / "bin" / "rlhfctl")
    where = run([str(installed / "bin" / "python"), "-c", "import rlhfctl; print(rlhfctl.__file__)"], cwd=tmp_path)
    assert str(installed) in where.stdout  # the installed copy, not this checkout
    listed = run([rlhfctl, "recipes", "list"], cwd=tmp_path).stdout
    assert "quickstart" in listed and "dpo-quickstart" in listed
    run([rlhfctl, "recipes", "copy", "quickstart", "mine.yaml"], cwd=tmp_path)
    assert (tmp_path / "mine.yaml").read_text() == (REPO / "recipes" / "quickstart.yaml").read_text()
    trained = run([rlhfctl, "train", "quickstart", "trainer.total_steps=1", "trainer.batch_size=2",
                   "trainer.mini_batch_size=2", "rollout.max_new_tokens=4", "data.num_train=4", "ray.backend=local"],
                  cwd=tmp_path)
    assert "run finished" in trained.stdout
    assert (tmp_path / "runs" / "quickstart" / "metrics.jsonl").exists()
