"""The generated project's own checks, run as its users would run them."""

import csv
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import (
    CAPABILITY_FILES,
    CAPABILITY_NEEDS,
    EVERY_CAPABILITY,
    python_with_test_packages,
    render,
    run_bounded,
)

NON_DEFAULT = {
    "project_name": "Défect Spotter",
    "backbone": "mobilenet_v3_small",
    "image_size": "96",
    "accelerator": "cpu",
    "precision": "32-true",
    "logger": "tensorboard",
    "python_version": "3.10",
    "inference": "no",
    "serving": "no",
    "experiments": "no",
    "timm": "no",
    "streaming": "no",
    "tuning": "no",
}


def project_env(project: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(project / "src"), "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}


def run_project_tests(project: Path, *pytest_args: str) -> None:
    temp = project.parent / "pytest-temp"
    # As the project's docs say to: in parallel, with the worker count and threads its conftest sets.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={temp}", "-n", "auto",
               *pytest_args]  # fmt: skip
    result = run_bounded(command, 1800, cwd=project, env=project_env(project))
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(r"\d+ passed", result.stdout)
    # Each test's checkpoints are gone once it passes: a whole run once left over 20 GB on the disk.
    left = {folder.name: sum(file.stat().st_size for file in folder.rglob("*") if file.is_file())
            for folder in temp.glob("*")}  # fmt: skip
    assert sum(left.values()) < 20 * 2**20, f"the passing tests left these many bytes: {left}"


@pytest.mark.slow
def test_the_full_project_passes_its_own_tests(full_project):
    # The default answers with every capability on. The default render's own code is this one's
    # without some capabilities, whose seams the non-default project below runs switched off.
    run_project_tests(full_project)


@pytest.mark.slow
def test_non_default_project_passes_its_own_tests(tmp_path):
    # Every capability off. The multi-process tests set their own logger and hardware, which these
    # answers do not change (the full project runs them); FSDP2's sharding follows the backbone, so it
    # runs here too. Exact resume's tests read none of these answers either: their options are their own.
    skipped = "(not test_distributed or fsdp2) and not test_safeguards and not test_exact_resume"
    run_project_tests(render(tmp_path, **NON_DEFAULT), "-k", skipped)


@pytest.mark.slow
@pytest.mark.rotated(seconds=25)
@pytest.mark.parametrize("left_out", list(CAPABILITY_FILES))
def test_a_project_without_one_capability_documents_only_what_it_holds(tmp_path, left_out):
    # The others on: every command, option, link and file its docs name is checked against this render
    # (the full and the all-off renders run their whole suites above; test_render lints every mix).
    # What needs the one left out goes with it (serving without inference: the hook refuses the mix).
    left = {left_out: "no"} | {
        capability: "no" for capability, (needed, _) in CAPABILITY_NEEDS.items() if needed == left_out
    }
    run_project_tests(render(tmp_path, logger="csv", **(EVERY_CAPABILITY | left)), "tests/test_docs.py")


@pytest.mark.slow
@pytest.mark.rotated(seconds=10)
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_project_installs_with_its_console_script(tmp_path, default_project, installer):
    # The environment borrows the test environment's packages: this checks the project's own
    # packaging (build backend, src layout, entry point), not a fresh torch download.
    env_dir = tmp_path / "env"
    python = python_with_test_packages(env_dir, with_pip=installer == "pip")
    if installer == "pip":
        install = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(default_project)]
    else:
        install = [sys.executable, "-m", "uv", "pip", "install", "--python", str(python), "--no-deps",
                   "--no-build-isolation", "-e", str(default_project)]  # fmt: skip
    installed = run_bounded(install, 600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    result = run_bounded(
        [str(env_dir / "bin" / "image_classifier"), "fit", "--help"],
        300,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--model.backbone" in result.stdout


STOP_THERE = """
import lightning as L


class StopThere(L.Callback):
    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.callback_metrics["val/acc"] >= 0.95:
            trainer.should_stop = True
"""


@pytest.mark.slow
def test_default_recipe_reaches_95_percent(tmp_path):
    """`python -m <package> fit` with nothing else, as the generated README promises."""
    project = render(tmp_path, logger="csv")
    # The run stops once it is there (at epoch 14 of 20 on a 2-core CPU): what comes after is the
    # recipe's own early stopping, which shorter tests cover, and six more epochs of CI time. (A
    # second EarlyStopping on val/acc would clash with the recipe's in the checkpoint's state.)
    (tmp_path / "stop_there.py").write_text(STOP_THERE)
    command = [sys.executable, "-m", "image_classifier", "fit", "--trainer.callbacks+=stop_there.StopThere"]
    env = project_env(project) | {"PYTHONPATH": os.pathsep.join([str(project / "src"), str(tmp_path)])}
    result = run_bounded(command, 1500, cwd=project, env=env)
    assert result.returncode == 0, result.stderr[-5000:]
    (metrics,) = project.glob("runs/*/version_0/metrics.csv")
    accuracies = [float(row["val/acc"]) for row in csv.DictReader(metrics.open()) if row["val/acc"]]
    print(f"validation accuracy per epoch: {[round(a, 3) for a in accuracies]}")
    assert max(accuracies) >= 0.95
    (best,) = project.glob("runs/*/version_0/checkpoints/epoch*-acc*.ckpt")
    assert float(best.stem.split("-acc")[1]) >= 0.95
