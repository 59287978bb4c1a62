"""`tune lr` and `tune batch_size`: Lightning's finders, written into configs/tuned.yaml only when they help."""

import csv
import sys

import pytest
import yaml
from conftest import ON_CPU, disk_full_past, refusal, run_command

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands import tune
from {{ cookiecutter.package_name }}.commands.tuned_config import update_tuned_config
from {{ cookiecutter.package_name }}.datasets.shapes import draw_shapes_dataset


def tiny(data_dir) -> list[str]:
    return [f"--data.data_dir={data_dir}", "--data.synthetic=false", "--data.batch_size=8", "--data.num_workers=0",
            "--data.image_size=32"]  # fmt: skip


def tuned(project) -> dict:
    path = project / "configs" / "tuned.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def test_lr_suggestion_is_a_tenth_of_the_rate_at_the_lowest_settled_loss():
    rates = [10 ** (exponent / 20) for exponent in range(-100, 20)]  # 1e-5 to 10, 120 points
    # Lightning's running mean starts low, then the loss falls to its lowest near rate 1 and turns up.
    falls = [0.5] * 10 + [2.0 - 0.01 * i for i in range(90)] + [1.2 + 0.5 * i for i in range(20)]
    assert tune.suggest_lr(rates, falls) == pytest.approx(rates[99] / 10)
    flat = [0.5] * 10 + [2.0 - 0.0005 * i for i in range(110)]  # a fall of 3 %: noise, not learning
    assert tune.suggest_lr(rates, flat) is None


def val_loss(monkeypatch, project, *args: str) -> float:
    """The last val/loss of a short fit through the command line, as its CSV log has it."""
    logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=check"]
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", "fit", *args, *logger])
    main()
    (metrics,) = (project / "check").rglob("metrics.csv")
    loss = [float(row["val/loss"]) for row in csv.DictReader(metrics.open()) if row["val/loss"]][-1]
    metrics.unlink()
    return loss


def shapes_and_two_epochs(tmp_path, lr: float) -> tuple[list[str], list[str]]:
    """Options for 246 training images of the shapes (31 batches an epoch: the last, of 6, is kept) at
    model.lr `lr`, and those for a two-epoch fit of them."""
    shapes = draw_shapes_dataset(tmp_path / "shapes", images_per_class={"train": 41, "val": 4}, size=32)
    options = [*ON_CPU, *tiny(shapes), f"--model.lr={lr}"]
    return options, [*options, "--trainer.max_epochs=2", "--trainer.num_sanity_val_steps=0"]


def test_on_the_shapes_data_the_default_rate_is_kept(monkeypatch, capsys, in_project_copy, tmp_path):
    # Lightning's own suggestion was 1.2e-6 here, a rate that trains nothing; a model trained from
    # scratch on the shapes has not started to learn within the range test, and the test says so.
    options, _ = shapes_and_two_epochs(tmp_path, 2e-3)
    run_command(monkeypatch, "tune", "lr", "--steps=100", "--epochs=2", *options, status=1)
    said = capsys.readouterr().out
    assert "The loss never fell by 5% in the range test (curve: runs/tune/lr_find.png)" in said
    assert "(one is 31 steps)" in said, said  # as fit counts them: 246 // 8 dropped the last batch
    assert "model" not in tuned(in_project_copy)
    assert (in_project_copy / "runs" / "tune" / "lr_find.png").is_file()
    assert not (in_project_copy / "reports").exists(), "a tuning run keeps no report"


def test_a_suggestion_that_trains_better_is_written(monkeypatch, in_project_copy, tmp_path):
    options, two_epochs = shapes_and_two_epochs(tmp_path, 1e-5)  # a current rate far too low
    monkeypatch.setattr(tune, "suggest_lr", lambda rates, losses: rates[-1] / 10)  # 10x the current rate
    run_command(monkeypatch, "tune", "lr", "--steps=5", "--epochs=2", *options)
    assert tuned(in_project_copy)["model"]["lr"] == pytest.approx(1e-4)
    without_lr = [option for option in two_epochs if not option.startswith("--model.lr=")]
    with_tuned = val_loss(monkeypatch, in_project_copy, "--config=configs/tuned.yaml", *without_lr)
    assert with_tuned <= val_loss(monkeypatch, in_project_copy, *two_epochs)


def test_a_suggestion_that_trains_worse_is_not_written(monkeypatch, capsys, in_project_copy, tiny_shapes):
    def worse_when_suggested(cli_args, lr, epochs):  # (val/acc, val/loss)
        return (0.5, 1.0) if lr == 2e-3 else (0.5, 1.2)

    monkeypatch.setattr(tune, "suggest_lr", lambda rates, losses: rates[-1] / 20)  # 5x the current rate
    monkeypatch.setattr(tune, "validation_after", worse_when_suggested)
    run_command(monkeypatch, "tune", "lr", "--steps=5", *ON_CPU, *tiny(tiny_shapes), status=1)
    printed = capsys.readouterr().out
    assert "model.lr 0.01 reaches val/loss 1.2000 (val/acc 0.5000), the current 0.002 1.0000" in printed
    assert "The current model.lr trains better: nothing written" in printed
    assert "model" not in tuned(in_project_copy)


def test_a_far_off_suggestion_is_written_only_when_asked(monkeypatch, capsys, in_project_copy, tiny_shapes):
    monkeypatch.setattr(tune, "suggest_lr", lambda rates, losses: rates[0] / 10)  # 1000x below the current rate
    run_command(monkeypatch, "tune", "lr", "--steps=5", *ON_CPU, *tiny(tiny_shapes), status=1)
    printed = capsys.readouterr().out
    assert "1000.0x below the current 0.002: not written" in printed and "--write" in printed
    assert "model" not in tuned(in_project_copy)
    run_command(monkeypatch, "tune", "lr", "--steps=5", "--write", *ON_CPU, *tiny(tiny_shapes))
    assert tuned(in_project_copy)["model"]["lr"] == pytest.approx(2e-6)


def test_batch_size_search_on_the_cpu_says_there_is_nothing_to_find(monkeypatch, capsys, in_project_copy, tiny_shapes):
    run_command(monkeypatch, "tune", "batch_size", *ON_CPU, *tiny(tiny_shapes), status=1)
    assert "GPU's memory" in capsys.readouterr().out
    assert not (in_project_copy / "configs" / "tuned.yaml").exists()


def test_batch_size_search_leaves_steps_in_an_epoch():
    # 2,400 training images on one process: from 64, up to 256 (9 steps), never the 4,096 of one step.
    assert tune.batch_search(2400, 64, max_trials=8) == (300, 2)
    assert tune.batch_search(2400 // 8, 64, max_trials=8) == (37, 0)  # eight processes: already there


def test_batch_size_found_is_capped_and_the_lr_follows_it(monkeypatch, capsys, in_project_copy, tiny_shapes):
    monkeypatch.setattr(tune, "CPUAccelerator", type("NoSuchAccelerator", (), {}))  # search the CPU as a GPU
    run_command(monkeypatch, "tune", "batch_size", *ON_CPU, *tiny(tiny_shapes), "--data.batch_size=4")
    # 72 training images: at most 9 per batch, so one doubling, from 4 to 8.
    assert tuned(in_project_copy)["data"]["batch_size"] == 8
    assert "model.scale_lr is on: training at this batch uses learning rate 0.00025" in capsys.readouterr().out


def test_tuned_settings_add_up_in_one_config_that_fit_reads(monkeypatch, capsys, in_project_copy, tiny_shapes):
    monkeypatch.setattr(tune, "CPUAccelerator", type("NoSuchAccelerator", (), {}))
    monkeypatch.setattr(tune, "suggest_lr", lambda rates, losses: rates[-1] / 20)
    data = tiny(tiny_shapes)
    run_command(monkeypatch, "tune", "lr", "--steps=5", "--write", *ON_CPU, *data)
    run_command(monkeypatch, "tune", "batch_size", "--max-trials=1", *ON_CPU, *data, "--data.batch_size=4")
    run_command(monkeypatch, "benchmark", "data", "--batches=2", *ON_CPU, *data)
    text = (in_project_copy / "configs" / "tuned.yaml").read_text()
    settings = yaml.safe_load(text)
    assert settings["model"]["lr"] > 0 and settings["data"]["batch_size"] == 8 and settings["data"]["num_workers"] >= 0
    notes = [line.split(":")[0] for line in text.splitlines()[1:4]]
    assert notes == ["# model.lr", "# data.batch_size", "# data.num_workers"]

    capsys.readouterr()
    run_command(monkeypatch, "fit", "--config=configs/tuned.yaml", "--print_config")
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["lr"] == settings["model"]["lr"]
    assert printed["data"]["batch_size"] == settings["data"]["batch_size"]


def test_a_full_disk_while_tuned_yaml_is_written_keeps_what_it_held(in_project_copy):
    update_tuned_config("model.lr", 0.0004, "tune lr")
    before = (in_project_copy / "configs" / "tuned.yaml").read_text()
    with pytest.raises(OSError, match="File too large"), disk_full_past(len(before)):
        update_tuned_config("data.batch_size", 96, "tune batch_size")
    assert (in_project_copy / "configs" / "tuned.yaml").read_text() == before
    assert not list((in_project_copy / "configs").glob(".*")), "staging file left behind"


def test_tune_takes_options_whole_as_fit_does(monkeypatch, capsys, in_project_copy):
    message = refusal(monkeypatch, capsys, "tune", "lr", *ON_CPU, "--model.backbon=resnet18")
    assert "unrecognized arguments: --model.backbon=resnet18. Did you mean model.backbone" in message


@pytest.mark.parametrize("option", ["--steps=1", "--steps=-5", "--epochs=0", "--max-trials=0"])
def test_a_count_out_of_range_is_refused_in_one_line(monkeypatch, capsys, in_project_copy, option):
    name, value = option.split("=")
    message = refusal(monkeypatch, capsys, "tune", "lr", *ON_CPU, option)
    assert f"{name} must be " in message and f"or more, got {value}" in message, message


def test_a_rate_of_0_has_no_range_to_search(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # Searched from 0/100 to 0x100, it ended in Lightning's ZeroDivisionError.
    message = refusal(monkeypatch, capsys, "tune", "lr", *ON_CPU, *tiny(tiny_shapes), "--model.lr=0")
    assert message == "error: model.lr is 0: the range test searches around the current rate; give one above 0."
