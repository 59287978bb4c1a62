"""A seed and deterministic mode give the same weights, data workers included; another seed does not."""

import sys

import torch

from {{ cookiecutter.package_name }}.cli import main

TRAINER = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32-true"]
DETERMINISTIC = ["--trainer.deterministic=true"]
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1"]
DATA = ["--data.synthetic=false", "--data.num_workers=2", "--data.batch_size=8"]
LOGGER = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=runs"]
ARGS = [*TRAINER, *DETERMINISTIC, *SHORT, *DATA, *LOGGER]


def train(monkeypatch, folder, data_dir, seed: int) -> dict:
    monkeypatch.chdir(folder)
    name = f"run{len(list(folder.glob('runs/*')))}"
    run = [f"--data.data_dir={data_dir}", f"--seed_everything={seed}", f"--trainer.logger.name={name}"]
    monkeypatch.setattr(sys, "argv", ["prog", "fit", *ARGS, *run])
    main()
    (last,) = sorted(folder.glob("runs/*/version_0/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)[-1:]
    return torch.load(last, map_location="cpu", weights_only=True)


def test_same_seed_same_weights_other_seed_other_weights(monkeypatch, in_project_copy, tiny_shapes):
    first = train(monkeypatch, in_project_copy, tiny_shapes, seed=7)
    again = train(monkeypatch, in_project_copy, tiny_shapes, seed=7)
    other = train(monkeypatch, in_project_copy, tiny_shapes, seed=8)
    weights = first["state_dict"].keys()
    assert all(torch.equal(first["state_dict"][k], again["state_dict"][k]) for k in weights)
    assert not all(torch.equal(first["state_dict"][k], other["state_dict"][k]) for k in weights)
    assert scores(first) == scores(again), "the logged metrics differ"


def scores(checkpoint: dict) -> list[float]:
    """The validation scores the checkpoint and early-stopping callbacks recorded."""
    found = []
    for state in checkpoint["callbacks"].values():
        found += [float(state[key]) for key in ("best_model_score", "best_score") if state.get(key) is not None]
    return found
