"""The benchmark scripts still run against the template as it is (their figures are not checked)."""

import os
import re
import sys

import pytest
from conftest import TEMPLATE, run_bounded

sys.path.insert(0, str(TEMPLATE / "benchmarks"))
import recipes  # noqa: E402


def run_benchmark(name: str, *args: str) -> str:
    command = [sys.executable, str(TEMPLATE / "benchmarks" / f"{name}.py"), *args]
    result = run_bounded(command, 900, cwd=TEMPLATE)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_a_recipe_run_that_fails_says_why(tmp_path):
    # Its output was kept from the terminal: a failed run ended the benchmark with only its command.
    (tmp_path / "image_classifier").mkdir()
    (tmp_path / "image_classifier" / "__main__.py").write_text("import sys\nsys.exit('the reason it failed')\n")
    with pytest.raises(SystemExit) as stopped:
        recipes.train(tmp_path, dict(os.environ), [], seed=0, epochs=1, name="broken")
    assert "the reason it failed" in str(stopped.value) and "error: the run broken failed" in str(stopped.value)


@pytest.mark.slow
@pytest.mark.rotated(seconds=10)
def test_decode_benchmark_compares_the_two_decoders():
    printed = run_benchmark("decode", "--images-per-class=4", "--workers", "0", "--repeats=1", "--batch-size=8")
    assert "torchvision" in printed and "PIL" in printed


def test_the_startup_benchmark_refuses_a_folder_that_is_not_lightning_hydra_template(tmp_path):
    command = [sys.executable, str(TEMPLATE / "benchmarks" / "startup.py"), "--lightning-hydra-template", str(tmp_path)]
    result = run_bounded(command, 60, cwd=TEMPLATE)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"error: {tmp_path} holds no src/train.py; give a checkout of lightning-hydra-template"
    ]


@pytest.mark.slow
@pytest.mark.rotated(seconds=65)
def test_startup_benchmark_times_the_commands_and_their_ratios(tmp_path):
    # A stand-in for lightning-hydra-template's checkout: its command must run there, as its debug=fdr.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(
        "import pathlib, sys\nassert sys.argv[1:] == ['debug=fdr'] and pathlib.Path('src/train.py').is_file()\n"
    )
    printed = run_benchmark("startup", "--repeats=1", "--lightning-hydra-template", str(tmp_path))
    for name in ("import lightning", "fit --help", "bare Lightning", "fast_dev_run", "lightning-hydra"):
        assert re.search(rf"^{name}\s+\d+\.\d\d", printed, re.MULTILINE), printed
    for other in ("bare Lightning", "lightning-hydra"):
        assert re.search(rf"^fast_dev_run / {other}, paired by round: median \d+\.\d\dx$", printed, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.rotated(seconds=45)
def test_parity_benchmark_runs_fit_as_configured_beside_the_plain_loop():
    printed = run_benchmark("parity", "--steps=2", "--warmup=1", "--repeats=1", "--batch-size=16")
    # fit's own choices of precision (the hardware rules') and workers (num_workers auto)
    assert re.search(r"^fit .*--trainer.max_steps=3 .*: resnet18, 64 px, \S+, batch 16, \d+ data workers$",
                     printed, re.MULTILINE), printed  # fmt: skip
    (row,) = re.findall(r"^\s+0\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+([\d.]+)\s+([\d.]+)$", printed, re.MULTILINE)
    assert row[0] == row[1], "both loops trained alike: the same last loss"
    assert re.search(r"^lightning / plain \(median ms/step\): \d+\.\d\dx", printed, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.rotated(seconds=50)
def test_recipes_benchmark_trains_the_strongest_recipe():
    # +ema: every recipe's options together, in one epoch of a few batches (a whole one took 3 minutes).
    printed = run_benchmark("recipes", "--datasets", "shapes", "--epochs=1", "--recipes", "+ema",
                            "--fit=--trainer.limit_train_batches=4")  # fmt: skip
    # best val/acc, wall seconds, then seconds to 90 % and to 95 % ("-": not reached in one epoch)
    assert re.search(r"^shapes\s+\+ema\s+0\s+[01]\.\d{4}\s+\d+(\s+(\d+|-)){2}$", printed, re.MULTILINE), printed


@pytest.mark.slow
@pytest.mark.rotated(seconds=90)
def test_streaming_benchmark_times_both_formats_and_the_shard():
    printed = run_benchmark("streaming", "--images=300", "--batches=2")
    assert "shard (2 processes)" in printed
    rows = [line.split() for line in printed.splitlines() if re.match(r"\s+[012]\s+\d", line)]
    assert [row[0] for row in rows] == ["0", "1", "2"]


@pytest.mark.slow
@pytest.mark.rotated(seconds=120)
def test_serve_load_benchmark_serves_both_models_at_both_batch_sizes_without_errors():
    printed = run_benchmark("serve_load", "--requests=24", "--warmup=2", "--clients=4", "--image-size=64")
    rows = [line.split() for line in printed.splitlines() if re.match(r"\s*(pytorch|onnx)\s+[18]\s", line)]
    assert [row[:2] for row in rows] == [["pytorch", "1"], ["pytorch", "8"], ["onnx", "1"], ["onnx", "8"]], printed
    assert all(row[5] == "0" for row in rows), printed
