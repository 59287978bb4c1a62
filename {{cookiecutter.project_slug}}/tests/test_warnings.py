"""A short run prints no warning but those on the allow-list below: each warning is either the
user's business or silenced at its source (training/quiet.py) or fixed."""

import re
import subprocess
import sys

import torch
from conftest import ON_CPU, command_env, run_group

# Each entry: a pattern of a warning that a normal run on this test's CPU may print, and why it stays.
ALLOWED: list[tuple[str, str]] = []

WARNING_LINE = re.compile(r"\.py:\d+: |warning|deprecat|Tip:", re.IGNORECASE)


# A command ends within this many seconds of its last line: no hang on closing workers, loggers or
# threads (generous: fit takes about 2 s on this 2-core machine).
EXIT_SECONDS = 5


def warnings_in(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if WARNING_LINE.search(line)]
    return [line for line in lines if not any(re.search(pattern, line) for pattern, _ in ALLOWED)]


COMMAND = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]


def test_a_short_fit_and_its_evaluation_print_no_stray_warning_and_end_at_once(in_project_copy, tiny_shapes):
    # The project's defaults (data workers, mixed precision, logger), made small and put on the CPU.
    short = [*ON_CPU, "--trainer.precision=bf16-mixed", f"--data.data_dir={tiny_shapes}", "--data.synthetic=false",
             "--data.batch_size=8", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
             "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1"]  # fmt: skip
    # The last evaluates on other data than the checkpoint's, into a new run (Lightning's notice that
    # the checkpoint's folder is not this run's is no news). The fit's ModelEMA, as the recipes add it,
    # is no callback the evaluations need.
    ema = "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.ModelEMA"
    for args in (
        ["fit", *short, ema],
        ["test", *short, "--ckpt_path=auto"],
        ["validate", *short, "--data.split_seed=8"],
    ):
        done = run_group([*COMMAND, *args], 300, cwd=in_project_copy, env=command_env())
        assert done.returncode == 0, done.stderr[-3000:]
        assert warnings_in(done.stdout + done.stderr) == [], f"{args[0]}: a warning not on the allow-list"
        assert done.silent_seconds < EXIT_SECONDS, f"{args[0]} ran {done.silent_seconds:.1f} s after its last line"
        # Output to a pipe or a file (a SLURM log, `| tee`) has no terminal colour codes, W&B's closing lines included.
        assert "\x1b[" not in done.stdout + done.stderr, f"{args[0]}: colour codes in piped output"
        # The model summary counts the FLOPs of one image (Lightning says 0 when it has none to run).
        assert not re.search(r"Total FLOPs: 0\b|\b0\s+Total Flops", done.stdout + done.stderr), done.stdout


def test_the_projects_own_warnings_are_one_line(tmp_path):
    # Python's format adds the file, line and source line that warned: two lines per unreadable image,
    # from each data worker, in a SLURM log.
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"no image")
    code = ("from {{ cookiecutter.package_name }}.datasets.images import labelled_image; "
            f"labelled_image({str(broken)!r}, 0, 'broken.png', None, skip_unreadable=True)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=command_env(), timeout=120)
    (line,) = done.stderr.splitlines()
    assert line.startswith("warning: Skipping the unreadable image broken.png ("), done.stderr


def test_a_fit_that_max_steps_stops_before_its_first_validation_ends_well_with_its_checkpoint(
    in_project_copy, tiny_shapes
):
    # 9 batches an epoch, 2 trained: no validation ran, so there is no val/acc to stop early on.
    short = [*ON_CPU, f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8",
             "--trainer.max_steps=2", "--trainer.log_every_n_steps=1"]  # fmt: skip
    done = run_group([*COMMAND, "fit", *short], 300, cwd=in_project_copy, env=command_env())
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    # Lightning's one word on it: the checkpoint that keeps the best val/acc had none to compare.
    no_best = r"`ModelCheckpoint\(monitor='val/acc'\)` could not find the monitored key"
    assert [line for line in warnings_in(done.stdout + done.stderr) if not re.search(no_best, line)] == []
    (last,) = in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2


def test_a_fit_with_no_logger_and_no_validation_trains_and_says_what_it_keeps(in_project_copy, tiny_shapes):
    # The recipe's learning-rate monitor has nothing to log into, and no val/acc picks a best checkpoint.
    short = [*ON_CPU, f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8",
             "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.log_every_n_steps=1"]  # fmt: skip
    off = ["--trainer.logger=false", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false"]
    done = run_group([*COMMAND, "fit", *short, *off], 300, cwd=in_project_copy, env=command_env())
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert warnings_in(done.stdout + done.stderr) == []
    (said,) = re.findall(
        r"Validation is off \(trainer.limit_val_batches=0\): (.*) wait on val/acc, never logged", done.stderr
    )
    assert set(said.split(" and ")) == {"ModelCheckpoint", "EarlyStopping"}
    last = torch.load(in_project_copy / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 2


def test_a_fit_with_checkpointing_off_trains_and_writes_no_checkpoint(in_project_copy, tiny_shapes):
    # The recipe lists its checkpoints, which Lightning refuses beside enable_checkpointing=false.
    short = [*ON_CPU, f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8",
             "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
             "--trainer.log_every_n_steps=1"]  # fmt: skip
    done = run_group([*COMMAND, "fit", *short, "--trainer.enable_checkpointing=false"], 300, cwd=in_project_copy,
                     env=command_env())  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert warnings_in(done.stdout + done.stderr) == []
    assert "Trainer.fit` stopped: `max_epochs=1` reached" in done.stderr
    assert list(in_project_copy.rglob("*.ckpt")) == []
    # The reports still go to the run's own folder, beside its config, not to one all runs share.
    (config,) = in_project_copy.glob("runs/*/*/config.yaml")
    expected = config.parent / "reports" / "per_class_accuracy_val.csv"
    assert list(in_project_copy.rglob(expected.name)) == [expected]


def test_the_tools_print_no_stray_warning_and_end_at_once(in_project_copy, tiny_shapes):
{%- if cookiecutter.tuning == "yes" or cookiecutter.experiments == "yes" %}
    short = [*ON_CPU, f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8",
             "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
             "--trainer.log_every_n_steps=1"]  # fmt: skip
{%- endif %}
    trainer = "".join(f"  {option.removeprefix('--trainer.').replace('=', ': ')}\n" for option in ON_CPU)
    (in_project_copy / "cpu.yaml").write_text(f"trainer:\n{trainer}data:\n  data_dir: {tiny_shapes}\n")
{%- if cookiecutter.experiments == "yes" %}
    (in_project_copy / "space.yaml").write_text("model.lr: {low: 1e-4, high: 1.0e-2, log: true}\n")
{%- endif %}
    commands = {
        "doctor": (["doctor", "--config=cpu.yaml"], {0}),
{%- if cookiecutter.tuning == "yes" %}
        # tune writes nothing after a range test this short, and says so with status 1
        "tune": (["tune", "lr", "--steps=5", "--epochs=1", *short], {0, 1}),
{%- endif %}
{%- if cookiecutter.experiments == "yes" %}
        "sweep": (["sweep", "space.yaml", "--trials=1", "--pruner=none", *short], {0}),
{%- endif %}
{%- if cookiecutter.streaming == "yes" %}
        "shard": (["shard", str(tiny_shapes), "shards", "--workers=1"], {0}),
{%- endif %}
    }
    for name, (args, statuses) in commands.items():
        done = run_group([*COMMAND, *args], 300, cwd=in_project_copy, env=command_env())
        assert done.returncode in statuses, done.stdout[-2000:] + done.stderr[-3000:]
        assert warnings_in(done.stdout + done.stderr) == [], f"{name}: a warning not on the allow-list"
        assert done.silent_seconds < EXIT_SECONDS, f"{name} ran {done.silent_seconds:.1f} s after its last line"
{%- if cookiecutter.tuning == "yes" %}
        if name == "tune" and done.returncode == 1:  # one range test, and no training after it
            assert len(re.findall(r"^Learning rate \S+ = ", done.stdout + done.stderr, re.MULTILINE)) == 1
{%- endif %}
