"""`report`: a run's logged metrics drawn as PNG curves."""

from conftest import run_command


{%- if cookiecutter.logger == "wandb" %}


def test_runs_logged_to_wandb_are_sent_to_its_app(monkeypatch, capsys, trained):
    run_command(monkeypatch, "report", status=2)
    assert "train with a CSV or TensorBoard logger" in capsys.readouterr().err
{%- else %}


def test_report_draws_the_newest_runs_curves(monkeypatch, capsys, trained):
    run_command(monkeypatch, "report")
    (curves,) = trained.glob("runs/*/*/reports/curves.png")
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = capsys.readouterr().out.split(": ", 1)[1].strip().split(", ")
    assert {"train/loss_step", "val/loss", "train/acc", "val/acc"} <= set(drawn)
    assert any(name.startswith("lr-") for name in drawn)
{%- endif %}


def test_a_folder_without_metrics_is_refused(monkeypatch, capsys, tmp_path):
    run_command(monkeypatch, "report", "--runs", str(tmp_path), status=2)
    assert "No metrics.csv or TensorBoard events" in capsys.readouterr().err
