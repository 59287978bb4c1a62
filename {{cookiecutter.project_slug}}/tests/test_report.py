"""`report`: a run's logged metrics drawn as PNG curves, whatever the logger."""

from conftest import refusal, run_command


def test_report_draws_the_newest_runs_curves(monkeypatch, capsys, trained):
    run_command(monkeypatch, "report")
    (curves,) = trained.glob("runs/*/*/reports/curves.png")
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = capsys.readouterr().out.split(": ", 1)[1].strip().split(", ")
    assert {"train/loss_step", "val/loss", "train/acc", "val/acc"} <= set(drawn)
    # The model's two parameter groups (with and without weight decay) share one schedule: one line.
    assert sum(name.startswith("lr-") for name in drawn) == 1, drawn


def test_a_folder_without_runs_is_refused(monkeypatch, capsys, tmp_path):
    assert "No run under" in refusal(monkeypatch, capsys, "report", "--runs", str(tmp_path))


def test_a_run_without_metrics_is_refused(monkeypatch, capsys, tmp_path):
    (tmp_path / "run").mkdir()
    assert "No metrics.csv or TensorBoard events" in refusal(monkeypatch, capsys, "report", str(tmp_path / "run"))


def test_a_metrics_file_that_is_not_numbers_is_refused_with_its_line(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,9,0.5\n0,19,0.5x\n")
    message = refusal(monkeypatch, capsys, "report", str(run))
    assert "metrics.csv, line 3," in message and "0.5x" in message
    (run / "metrics.csv").write_text("epoch,val/acc\n0,0.5\n")
    assert "line 2," in refusal(monkeypatch, capsys, "report", str(run))
