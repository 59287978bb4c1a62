"""`benchmark data` and `benchmark train` measure, print, and leave a config the CLI can use."""

import statistics

import lightning as L
import pytest
import torch
import yaml
from conftest import ON_CPU, refusal, run_command

from {{ cookiecutter.package_name }}.commands import benchmark
from {{ cookiecutter.package_name }}.commands.benchmark import flops_per_image, peak_flops
from {{ cookiecutter.package_name }}.model import ImageClassifier


def on_data(data_dir) -> list[str]:
    return [f"--data.data_dir={data_dir}", "--data.synthetic=false", "--data.batch_size=8"]


def test_data_benchmark_writes_the_fastest_worker_count(monkeypatch, capsys, in_project_copy, tiny_shapes):
    run_command(monkeypatch, "benchmark", "data", "--batches=3", *ON_CPU, *on_data(tiny_shapes))
    printed = capsys.readouterr().out
    measured = [line.split() for line in printed.splitlines() if line.strip()[:1].isdigit()]
    assert [int(workers) for workers, _ in measured][:2] == [0, 1] and all(float(speed) > 0 for _, speed in measured)
    tuned = yaml.safe_load((in_project_copy / "configs" / "tuned.yaml").read_text())
    assert tuned["data"]["num_workers"] in {int(workers) for workers, _ in measured}

    run_command(monkeypatch, "fit", "--config=configs/tuned.yaml", "--print_config")
    assert yaml.safe_load(capsys.readouterr().out)["data"]["num_workers"] == tuned["data"]["num_workers"]


def test_data_benchmark_times_the_worker_counts_asked_for(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # Every count asked for is timed, even when more workers stopped paying (0 then 1 here would stop the scan).
    run_command(monkeypatch, "benchmark", "data", "--batches=2", "--workers=2,0,1", *ON_CPU, *on_data(tiny_shapes))
    measured = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(workers) for workers, _ in measured] == [2, 0, 1]
    tuned = yaml.safe_load((in_project_copy / "configs" / "tuned.yaml").read_text())
    assert tuned["data"]["num_workers"] in {0, 1, 2}


def test_a_bad_worker_list_is_refused_before_any_work(monkeypatch, capsys, in_project_copy):
    refused = refusal(monkeypatch, capsys, "benchmark", "data", "--workers=4,x")
    assert "argument --workers: worker counts are whole numbers separated by commas, got '4,x'" in refused
    assert not (in_project_copy / "data").exists()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # It named configs/trainer/auto.yaml as where the value came from.
        (["train", "--precision=bf16-mxed"], "bf16-mxed is no precision Lightning trains in (did you mean bf16-mix"),
        (["train", "--precision=32-true,fp8"], "fp8 is no precision Lightning trains in: give some such as 32-true"),
        (["data", "--precision=bf16-mixed"], "--precision is an option of benchmark train"),  # it was ignored
        (["train", "--workers=2"], "--workers is an option of benchmark data"),
    ],
)
def test_an_option_of_the_other_benchmark_or_an_unknown_precision_is_refused(
    monkeypatch, capsys, in_project_copy, given, expected
):
    assert expected in refusal(monkeypatch, capsys, "benchmark", *given, *ON_CPU)
    assert not (in_project_copy / "configs" / "tuned.yaml").exists()


@pytest.mark.parametrize(
    ("what", "option"), [("data", "--batches=0"), ("train", "--steps=0"), ("train", "--warmup=-1")]
)
def test_a_count_that_would_time_nothing_is_refused(monkeypatch, capsys, in_project_copy, what, option):
    # --batches 0 timed no batch and wrote its "0 images/s" into tuned.yaml over a real measurement.
    name, value = option.split("=")
    message = refusal(monkeypatch, capsys, "benchmark", what, *ON_CPU, option)
    assert f"error: {name} must be {int(value) + 1} or more, got {value} (python -m" in message, message
    assert not (in_project_copy / "configs" / "tuned.yaml").exists()


def test_train_benchmark_reports_images_per_second(monkeypatch, capsys, in_project_copy, tiny_shapes):
    run_command(monkeypatch, "benchmark", "train", "--steps=2", "--warmup=1", *ON_CPU, *on_data(tiny_shapes),
            "--data.num_workers=0")  # fmt: skip
    printed = capsys.readouterr().out
    assert "Training: {{ cookiecutter.backbone }}, 32-true, 1 x cpu" in printed and " images/s (" in printed
    assert not (in_project_copy / "runs").exists(), "a benchmark writes no run"
    assert not (in_project_copy / "config.yaml").exists()


def test_train_benchmark_compares_precisions_side_by_side(monkeypatch, capsys, in_project_copy, tiny_shapes):
    options = ["--steps=2", "--warmup=1", "--precision=all", *on_data(tiny_shapes), "--data.num_workers=0"]
    run_command(monkeypatch, "benchmark", "train", "--trainer.devices=1", *options)
    printed = capsys.readouterr().out.splitlines()
    header = printed.index("precision     images/s   turns from-to  vs 32-true")
    rows = [line.split() for line in printed[header + 1 : header + 3]]
    assert [row[0] for row in rows] == ["32-true", "bf16-mixed"] and rows[0][3] == "1.00x"
    # Each timed in turns with the other (a fit each, 32-true first): the median of its turns, and their range.
    timed = [float(printed[i + 1].split()[0]) for i, line in enumerate(printed) if line.startswith("Training: ")]
    assert len(timed) == 2 * benchmark.TURNS
    for row, turns in zip(rows, (timed[0::2], timed[1::2]), strict=True):
        assert float(row[1]) == pytest.approx(statistics.median(turns), abs=0.5)
        assert row[2] == f"{min(turns):.0f}-{max(turns):.0f}"
    assert printed[-1].startswith("Fastest here: ")
    assert printed[-1].endswith(f"the median of {benchmark.TURNS} turns each")


def test_the_benchmarks_time_a_recipes_epochs_with_its_policy_and_mixing_on(monkeypatch, capsys, in_project_copy,
                                                                            tiny_shapes):  # fmt: skip
    trained = []
    monkeypatch.setattr(L.Trainer, "fit", lambda trainer, model, data: trained.append((model, data)))
    message = refusal(monkeypatch, capsys, "benchmark", "train", *ON_CPU, *on_data(tiny_shapes),
                      "--data.augment=trivialaugment", "--data.basic_augment_epochs=10", "--model.mixup_alpha=0.2",
                      "--model.unmixed_epochs=10")  # fmt: skip
    assert "Too few training batches" in message, "nothing timed: the fit was not run"
    ((model, data),) = trained
    assert (data.hparams.basic_augment_epochs, model.hparams.unmixed_epochs) == (0, 0)


def test_flops_are_counted_for_forward_and_backward():
    # resnet18 at 64 px: about 0.15 GMAC forward, so ~0.9 GFLOP with the backward pass's two matmuls.
    assert 0.6e9 < flops_per_image(ImageClassifier(num_classes=6, backbone="resnet18"), 64) < 1.2e9


@pytest.mark.parametrize("name", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_mfu_counts_a_hopper_gpus_dense_peak(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # NVIDIA's datasheets give both SXM chips 1,979 TFLOP/s in bf16 with 2:4 sparsity: half that dense.
    assert peak_flops(torch.device("cuda", 0), torch.bfloat16) == pytest.approx(1979e12 / 2, rel=1e-3)
