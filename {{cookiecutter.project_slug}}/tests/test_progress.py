import itertools
import math
import re
import sys
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import ON_CPU, on_data
from torch.nn.functional import cross_entropy

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier
from {{ cookiecutter.package_name }}.training import progress
from {{ cookiecutter.package_name }}.training.progress import LogLines


def fit_at(epoch: int, step: int, done: int, max_steps: int, max_epochs: int = 10, batches: float = 9, accumulate=1):
    """A trainer's counts as a fit starts at `epoch`, `step`, `done` batches into the epoch."""
    epoch_loop = SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(completed=done)))
    return SimpleNamespace(current_epoch=epoch, global_step=step, max_steps=max_steps, max_epochs=max_epochs,
                           num_training_batches=batches, accumulate_grad_batches=accumulate,
                           fit_loop=SimpleNamespace(epoch_loop=epoch_loop))  # fmt: skip


def test_the_last_epoch_is_counted_from_where_the_fit_is():
    assert progress.last_epoch(fit_at(0, 0, 0, max_steps=-1, max_epochs=3)) == 2
    assert progress.last_epoch(fit_at(0, 0, 0, max_steps=10)) == 1, "9 steps an epoch: step 10 is epoch 1's"
    assert progress.last_epoch(fit_at(0, 5, 5, max_steps=10)) == 1, "resumed inside epoch 0"
    # Resumed at epoch 1 after 9 steps, now 3 batches a step (3 steps an epoch): 6 steps are 2 epochs.
    assert progress.last_epoch(fit_at(1, 9, 0, max_steps=15, accumulate=3)) == 2
    assert progress.last_epoch(fit_at(0, 0, 0, max_steps=-1, max_epochs=-1)) is None
    assert progress.last_epoch(fit_at(0, 0, 0, max_steps=10, max_epochs=-1, batches=math.inf)) is None


def test_lines_every_n_steps_and_per_epoch_with_the_epochs_numbers(monkeypatch, capsys, tiny_shapes):
    clock = itertools.count(start=1.0)  # each reading one second after the last
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=6, backbone="resnet18", pretrained=False, lr=1e-3)
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=8, image_size=32)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        limit_train_batches=5,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[LogLines(every_n_steps=2)],
    )
    trainer.fit(model, data)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch")]

    # 5 steps of 8 images, the clock one second on at each step: 8 images/s, lines after steps 2 and 4.
    heads = [re.match(r"Epoch \d/\d  (step \d/5|done)", line).group() for line in lines]
    assert heads == [f"Epoch {epoch}/1  {what}" for epoch in (0, 1) for what in ("step 2/5", "step 4/5", "done")]
    assert all(line.endswith("  8 img/s") for line in lines if "step" in line), lines
    assert lines[-1].endswith("  8 img/s  6 s"), lines[-1]  # 40 images in 5 s of steps; 6 s with validation

    # The last epoch's validation numbers, computed here from the trained model over every val image.
    model.eval()
    data.setup("validate")
    with torch.no_grad():
        batches = [data.on_after_batch_transfer(batch, 0) for batch in data.val_dataloader()]
        outputs = [(model(images), labels) for images, labels in batches]
    logits, labels = torch.cat([o for o, _ in outputs]), torch.cat([y for _, y in outputs])
    printed = {name: float(value) for name, value in re.findall(r"(val/\w+) (\S+)", lines[-1])}
    assert printed["val/acc"] == pytest.approx((logits.argmax(1) == labels).float().mean().item(), abs=5e-4)
    assert printed["val/loss"] == pytest.approx(cross_entropy(logits, labels).item(), rel=1e-3)
    assert " train/loss_epoch " in lines[-1] and " train/loss " not in lines[-1], "one loss, not the same one twice"
    # The learning rate of each epoch's last step (steps 4 and 9 of 10), logged or not: no LearningRateMonitor
    # here. The schedule's warm-up, then its cosine down to 0 at step 10, which no step takes.
    warmup = round(10 * model.hparams.warmup_fraction)
    for line, step in zip([line for line in lines if " done " in line], (4, 9), strict=True):
        rate = model.scaled_lr() * (0.5 * (1 + math.cos(math.pi * (step - warmup) / (10 - warmup))))
        assert float(re.search(r"  lr (\S+)  ", line).group(1)) == pytest.approx(rate, rel=1e-3), line


def test_a_frozen_backbones_epoch_line_gives_it_the_rate_it_trained_at(capsys, tiny_shapes):
    model = ImageClassifier(num_classes=6, backbone="resnet18", pretrained=False, frozen_backbone_epochs=1)
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=8, image_size=32)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=3, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[LogLines()])  # fmt: skip
    trainer.fit(model, data)
    (frozen,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch 0/1  done")]
    rates = {name: float(value) for name, value in re.findall(r"  lr-(\w+) (\S+)", frozen)}
    assert rates["backbone"] == rates["backbone_no_decay"] == 0 < rates["head"], frozen


def test_a_fit_that_max_steps_ends_inside_an_epoch_says_where_it_stopped(capsys, tiny_shapes):
    # Its line said "Epoch 0/9  done" after 3 of 5 steps, and again after a resume with more steps.
    model = ImageClassifier(num_classes=6, backbone="resnet18", pretrained=False)
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=8, image_size=32)
    trainer = L.Trainer(accelerator="cpu", max_epochs=10, max_steps=7, limit_train_batches=5, limit_val_batches=1,
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        callbacks=[LogLines()])  # fmt: skip
    trainer.fit(model, data)
    heads = re.findall(r"^Epoch (\d/9  (?:done|stopped at step \d/5))", capsys.readouterr().out, re.MULTILINE)
    assert heads == ["0/9  done", "1/9  stopped at step 2/5"]


def test_a_first_line_after_ten_steps_then_one_every_thirty_seconds_at_most(monkeypatch, capsys, tiny_shapes):
    clock = itertools.count(start=1.0, step=2.0)  # each reading two seconds after the last: 2 s a step
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    model = ImageClassifier(num_classes=6, backbone="resnet18", pretrained=False)
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=2, image_size=32)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=34, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[LogLines()])  # fmt: skip
    trainer.fit(model, data)
    steps = re.findall(r"^Epoch 0/0  step (\d+)/34", capsys.readouterr().out, re.MULTILINE)
    # Not a line every 100 steps, which a slow epoch would never print: after step 10 (20 s), then 30 s later.
    assert steps == ["10", "25"], steps


@pytest.mark.parametrize("terminal", [False, True])
def test_output_that_is_no_terminal_gets_lines_for_a_bar(monkeypatch, capsys, in_project_copy, tiny_shapes, terminal):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    short = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *ON_CPU, *on_data(tiny_shapes), *short])
    main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch 0/0  done")]
    assert len(lines) == (0 if terminal else 1)
