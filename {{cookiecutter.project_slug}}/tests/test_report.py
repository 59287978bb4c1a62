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


def test_an_abbreviated_option_is_refused_as_fits_are(monkeypatch, capsys, tmp_path):
    # argparse took --ru for --runs (as each command's own parser did), where fit refuses abbreviations.
    message = refusal(monkeypatch, capsys, "report", "--ru", str(tmp_path))
    assert message.startswith("error: unrecognized argument --ru: did you mean --runs?"), message


def test_outside_the_project_the_runs_are_not_searched_for_in_every_folder_below(monkeypatch, capsys, tmp_path):
    # Its configs say where fit puts runs: without them, report took a run anywhere under the folder it ran in.
    (tmp_path / "elsewhere" / "checkpoints").mkdir(parents=True)
    (tmp_path / "elsewhere" / "checkpoints" / "last.ckpt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    message = refusal(monkeypatch, capsys, "report")
    assert message.endswith(f"in {tmp_path}: run from the project folder, or pass --runs."), message


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


def test_a_folder_holding_one_run_reports_it_and_one_holding_more_names_them(monkeypatch, capsys, tmp_path):
    # A folder of several runs' (one per fold or trial) holds each run a level or two down: it was refused.
    run = tmp_path / "set" / "part0" / "project" / "abc123"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,9,0.5\n1,19,0.6\n")
    run_command(monkeypatch, "report", str(tmp_path / "set" / "part0"))
    assert (run / "reports" / "curves.png").is_file()
    other = tmp_path / "set" / "part1" / "project" / "def456"
    other.mkdir(parents=True)
    (other / "metrics.csv").write_text("epoch,step,val/acc\n0,9,0.5\n")
    message = refusal(monkeypatch, capsys, "report", str(tmp_path / "set"))
    assert message.startswith(f"error: {tmp_path / 'set'} holds 2 runs: give one of them, such as "), message
    assert "is not a folder" in refusal(monkeypatch, capsys, "report", str(tmp_path / "none"))
