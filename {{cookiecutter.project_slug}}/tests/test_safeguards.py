"""Failures that stop a run say where and why, and never cost the last good checkpoint or hang."""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import ON_CPU, command_env, run_group

from {{ cookiecutter.package_name }}.cli import build
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training.callbacks import EndWithLauncher, NonFiniteLossError, StopOnNonFiniteLoss


class NaNAtStep(ImageClassifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step == 2 else loss


def fit(tiny_shapes, callbacks) -> NaNAtStep:
    model = NaNAtStep(num_classes=6, backbone="resnet18", batch_size=8, base_batch_size=8)
    trainer = L.Trainer(accelerator="cpu", max_steps=4, callbacks=callbacks, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(model, ImageDataModule(tiny_shapes, num_workers=0, batch_size=8))
    return model


def finite(model: torch.nn.Module) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_loss_stops_before_the_update_naming_step_and_batch(tiny_shapes):
    with pytest.raises(NonFiniteLossError, match=r"not finite at global step 2 \(epoch 0, batch 2\)") as error:
        fit(tiny_shapes, [StopOnNonFiniteLoss()])
    assert "skip_batches" in str(error.value)


def test_non_finite_batches_can_be_skipped(tiny_shapes):
    with pytest.warns(UserWarning, match="dropping this batch's update"):
        model = fit(tiny_shapes, [StopOnNonFiniteLoss(skip_batches=True)])
    assert model.global_step == 4 and finite(model)


def test_without_the_guard_the_weights_would_be_ruined(tiny_shapes):
    assert not finite(fit(tiny_shapes, []))  # what the guard prevents, so the tests above mean something


def test_an_exception_in_one_process_ends_every_process(in_project_copy, tiny_shapes):
    failure = json.dumps({"class_path": "helper_callbacks.FailOnRank", "init_args": {"rank": 1, "step": 2}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--trainer.accelerator=cpu",
               "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.precision=32-true",
               "--trainer.max_epochs=1", f"--trainer.callbacks+={failure}", f"--data.data_dir={tiny_shapes}",
               "--data.synthetic=false", "--data.num_workers=0", "--data.batch_size=4"]  # fmt: skip
    # The timeout is the hang this guards against: a process left waiting for its dead peer.
    result = run_group(command, 300, cwd=in_project_copy, env=command_env())
    assert result.returncode != 0
    assert "injected failure on rank 1" in result.stderr


def test_a_non_finite_loss_in_every_process_is_told_once_with_its_status(in_project_copy, tiny_shapes):
    # Images divided by a std of 1e-38 reach float32's largest values: the loss is not finite at once.
    # The first process is slow to end, as with W&B's upload: Lightning's launcher would SIGKILL it.
    slow = json.dumps({"class_path": "helper_callbacks.SlowToEnd", "init_args": {"seconds": 7}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--trainer.accelerator=cpu",
               "--trainer.precision=32-true", "--trainer.devices=2", "--trainer.strategy=ddp",
               "--trainer.max_epochs=1", f"--trainer.callbacks+={slow}", f"--data.data_dir={tiny_shapes}",
               "--data.synthetic=false", "--data.num_workers=0", "--data.batch_size=4",
               "--data.std=[1.0e-38,1.0e-38,1.0e-38]"]  # fmt: skip
    result = run_group(command, 300, cwd=in_project_copy, env=command_env())
    assert result.returncode == 1, result.stderr[-4000:]
    (told,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert told.startswith("error: Loss is not finite at global step 0") and "intact" not in told, told


def test_every_trainer_has_the_launcher_watch_and_can_be_pickled(monkeypatch, in_project_copy):
    # ddp_spawn pickles the Trainer, callbacks included, into the processes it starts.
    monkeypatch.setenv("LOCAL_RANK", "0")  # as Lightning's launcher sets it in its own process, rank 0
    assert EndWithLauncher()._launcher is None
    monkeypatch.setenv("LOCAL_RANK", "1")  # as in a process that Lightning's launcher started
    trainer = build([*ON_CPU, "--trainer.logger=false"]).trainer
    (watch,) = [callback for callback in trainer.callbacks if isinstance(callback, EndWithLauncher)]
    assert watch._done is not None and not watch._done.is_set()
    copy = pickle.loads(pickle.dumps(watch))
    assert copy._launcher is None  # a copy in another process watches nothing
    watch.teardown(trainer, None, "fit")
    assert watch._done.is_set()


# A command (here the owner) whose helper, once it leaves SIGTERMs to the owner, prints its pid.
OWNER_OF_A_HELPER = """
import multiprocessing, os, time
from {{ cookiecutter.package_name }}.training import sigterm

def helper(owner):
    sigterm.leave_to(owner)
    print(os.getpid(), flush=True)
    time.sleep(600)

if __name__ == "__main__":
    multiprocessing.get_context("fork").Process(target=helper, args=(os.getpid(),)).start()
    time.sleep(600)
"""


def parent_of(pid: int) -> int:
    return int(re.search(r"^PPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE).group(1))


def ended(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()  # gone, or a zombie no one reaps


@pytest.mark.skipif(not hasattr(signal, "sigtimedwait"), reason="helpers leave SIGTERMs to their owner on Linux only")
def test_a_helper_whose_owner_was_killed_outright_ends_of_itself(tmp_path):
    # A server killed with SIGKILL would leave its model worker holding the GPU.
    owner = subprocess.Popen([sys.executable, "-c", OWNER_OF_A_HELPER], stdout=subprocess.PIPE, text=True,
                             cwd=tmp_path, env=command_env())  # fmt: skip
    helper = int(owner.stdout.readline())
    try:
        os.kill(helper, signal.SIGTERM)  # from the test, while the owner lives: left to the owner
        time.sleep(1.5)
        assert not ended(helper)
        owner.kill()  # and not reaped: a zombie, which os.kill(owner, 0) still finds
        deadline = time.monotonic() + 10
        while not ended(helper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended(helper), "the helper outlived its owner"
    finally:
        owner.kill()
        owner.wait()
        if not ended(helper):
            os.kill(helper, signal.SIGKILL)
