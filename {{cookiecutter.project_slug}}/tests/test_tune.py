"""`tune lr` and `tune batch_size`: Lightning's finders, written into configs/tuned.yaml."""

import yaml
from conftest import ON_CPU, run_command


def test_tuned_settings_add_up_in_one_config_that_fit_reads(monkeypatch, capsys, in_project_copy, tiny_shapes):
    data = [f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=4", "--data.num_workers=0"]
    run_command(monkeypatch, "tune", "lr", "--steps=30", *ON_CPU, *data)
    run_command(monkeypatch, "tune", "batch_size", "--max-trials=1", *ON_CPU, *data)
    run_command(monkeypatch, "benchmark", "data", "--batches=2", *ON_CPU, *data)
    text = (in_project_copy / "configs" / "tuned.yaml").read_text()
    tuned = yaml.safe_load(text)
    assert tuned["model"]["lr"] > 0 and tuned["data"]["batch_size"] == 4 and tuned["data"]["num_workers"] >= 0
    notes = [line.split(":")[0] for line in text.splitlines()[1:4]]
    assert notes == ["# model.lr", "# data.batch_size", "# data.num_workers"]

    capsys.readouterr()
    run_command(monkeypatch, "fit", "--config=configs/tuned.yaml", "--print_config")
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["lr"] == tuned["model"]["lr"]
    assert printed["data"]["batch_size"] == tuned["data"]["batch_size"]
