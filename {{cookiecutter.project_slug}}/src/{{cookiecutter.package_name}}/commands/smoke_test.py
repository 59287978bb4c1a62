"""`python -m {{ cookiecutter.package_name }} doctor --smoke`: does training work here, end to end?

A fast_dev_run on the configured hardware, then a two-batch fit that writes a checkpoint, which is
reloaded. Where the configured hardware is missing, both run on what this machine has, and a
FALLBACK line says so. Each step is a command of its own, as a user runs it; their output goes to a
log that the summary names. Rerun it after changing configs, hardware or dependencies.
"""

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

from ..errors import PACKAGE
from ..hardware.checks import machine_of
from ..hardware.rules import from_trainer, runnable, target
from ..training.run_folders import newest_run

CLI = [sys.executable, "-m", PACKAGE]
# Where each accelerator that hardware/rules.py's target names trains, in words.
DEVICES = {"cuda": "NVIDIA GPUs", "mps": "the Apple silicon GPU", "cpu": "the CPU"}
# Begins the options a fallback passed with; scripts/make_env.py reads them from here into its "Next" steps.
HERE = "On this machine, fit with: "
RUNS = Path("runs") / "smoke-test"
LOG = RUNS / "smoke.log"


class StepFailed(Exception):
    def __init__(self, title: str, command: list[str]) -> None:
        super().__init__(title)
        self.title, self.command = title, command


def smoke_test(facts: dict, trainer: dict, configs: list[Path]) -> int:
    """Run the two steps and print what ran where; 0 when both passed."""
    configured = from_trainer(trainer)
    machine = machine_of(facts)
    settings, fallback = runnable(configured, machine)
    changed = [f.name for f in fields(settings) if getattr(settings, f.name) != getattr(configured, f.name)]
    changed_options = [f"--trainer.{key}={getattr(settings, key)}" for key in changed]
    options = [*(f"--config={path}" for path in configs), *changed_options]
    device = DEVICES.get(target(settings, machine), f"accelerator {settings.accelerator}")
    where = f"{device} (accelerator {settings.accelerator}, devices {settings.devices}, "
    where += f"strategy {settings.strategy}, precision {settings.precision})"
    fell_back = changed != ["precision"] and bool(changed)  # the hardware, not only fit's choice of precision
    if fell_back:
        print(f"FALLBACK: {fallback}: the smoke test runs on {where} instead.")
    elif fallback:
        print(f"Precision {settings.precision}, as fit picks it on this machine: {fallback}.")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    try:
        started = time.monotonic()
        step("Smoke test 1/2: fast_dev_run (one batch of training and validation)",
             [*CLI, "fit", *options, "--trainer.fast_dev_run=true"])  # fmt: skip
        print(f"Ran fast_dev_run on {where}: {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        checkpoint = fit_and_reload(options)
        print(
            f"Ran a two-batch fit and reloaded its checkpoint {checkpoint}, then removed it: "
            f"{time.monotonic() - started:.1f} s"
        )
    except StepFailed as failure:
        print(f"Failed: {failure.title}")
        print(f"Command: {as_run(failure.command)}")
        print(f"Likely fix: the last line of the log says: {last_line(LOG.read_text())}")
        print(f"Full log: {LOG.resolve()}")
        print("smoke test failed")
        return 1
    if fell_back:  # the configured hardware is not here: a plain fit is refused
        print(f"Passed on the fallback, not on the configured hardware. {HERE}{shlex.join(changed_options)}")
    print(f"Full log: {LOG.resolve()}")
    print("smoke test passed")
    return 0


def fit_and_reload(options: list[str]) -> Path:
    """A two-batch fit into runs/smoke-test, and its last checkpoint reloaded as a user would, then
    removed with the run's other checkpoints."""
    tiny = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={RUNS.parent}",
            f"--trainer.logger.name={RUNS.name}"]  # fmt: skip
    step("Smoke test 2/2: a two-batch fit that writes a checkpoint, then reloading it", [*CLI, "fit", *options, *tiny])
    checkpoint = newest_run(RUNS) / "checkpoints" / "last.ckpt"
    if checkpoint.is_dir():  # FSDP and DeepSpeed write shards: make the single file a user would load
        single = checkpoint.with_name("last-consolidated.ckpt")
        step("Consolidating the sharded checkpoint", [*CLI, "consolidate", str(checkpoint), str(single)])
        checkpoint = single
    reload = "import sys; from {{ cookiecutter.package_name }} import ImageClassifier; "
    reload += "print(ImageClassifier.load_from_checkpoint(sys.argv[1], map_location='cpu').hparams.class_names)"
    step("Reloading the checkpoint", [sys.executable, "-c", reload, str(checkpoint)])
    # Commands that take the newest run's checkpoint ({{ "classify, report" if cookiecutter.inference == "yes" else "report, evaluations" }}) must take the user's, not this.
    shutil.rmtree(checkpoint.parent)
    return checkpoint


def step(title: str, command: list[str]) -> None:
    print(f"{title} ...", flush=True)
    with LOG.open("a") as log:
        log.write(f"\n$ {as_run(command)}\n")
        log.flush()
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
            raise StepFailed(title, command)


def as_run(command: list[str]) -> str:
    """The command as it ran, to copy into a shell: with its PYTHONPATH (src/, where the project is not installed)."""
    path = os.environ.get("PYTHONPATH")
    return (f"PYTHONPATH={shlex.quote(path)} " if path else "") + shlex.join(command)


def last_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
