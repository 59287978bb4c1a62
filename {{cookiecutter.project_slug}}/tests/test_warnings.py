"""A short run prints no warning but those on the allow-list below: each warning is either the
user's business or silenced at its source (quiet.py) or fixed."""

import re
import sys

from conftest import ON_CPU, command_env, run_group

# Each entry: a pattern of a warning that a normal run on this test's CPU may print, and why it stays.
ALLOWED: list[tuple[str, str]] = []

WARNING_LINE = re.compile(r"\.py:\d+: |warning|deprecat|Tip:", re.IGNORECASE)


def warnings_in(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if WARNING_LINE.search(line)]
    return [line for line in lines if not any(re.search(pattern, line) for pattern, _ in ALLOWED)]


def test_a_short_fit_and_its_evaluation_print_no_stray_warning(in_project_copy, tiny_shapes):
    # The project's defaults (data workers, mixed precision, logger), made small and put on the CPU.
    short = [*ON_CPU, "--trainer.precision=bf16-mixed", f"--data.data_dir={tiny_shapes}", "--data.synthetic=false",
             "--data.batch_size=8", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
             "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1"]  # fmt: skip
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    for args in (["fit", *short], ["test", *short, "--ckpt_path=auto"]):
        done = run_group([*command, *args], 300, cwd=in_project_copy, env=command_env())
        assert done.returncode == 0, done.stderr[-3000:]
        assert warnings_in(done.stdout + done.stderr) == [], f"{args[0]}: a warning not on the allow-list"
