"""The post-generation hook: git, the environment, the smoke test, and what it says."""

import contextlib
import http.server
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import TEMPLATE, render, run_bounded

FORCE = "LIGHTNING_TEMPLATE_SETUP"


# Variables that would change what the hook does, whatever machine the tests run on.
UNSET = ("CI", FORCE, "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "PIP_INDEX_URL", "UV_INDEX_URL")
CPU_WHEELS = "LIGHTNING_TEMPLATE_CPU_WHEELS"
# A closed port on this machine: the tests never reach out to PyTorch's index.
CLOSED = "http://127.0.0.1:9"


def hook_env(env: dict[str, str]) -> dict[str, str]:
    """This environment without what would change the hook's course, PyTorch's index out of reach, then `env`."""
    return {key: value for key, value in os.environ.items() if key not in UNSET} | {CPU_WHEELS: CLOSED} | env


def cookiecutter_command(output_dir: Path, python: str | Path = sys.executable, **answers: str) -> list:
    args = [f"{key}={value}" for key, value in answers.items()]
    return [python, "-m", "cookiecutter", "--no-input", "-o", str(output_dir), str(TEMPLATE), *args]


def generate(output_dir: Path, env: dict[str, str], timeout: int = 1800, **answers: str) -> subprocess.CompletedProcess:
    command = cookiecutter_command(output_dir, **answers)
    return run_bounded(command, timeout, env=hook_env(env), stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def package_index():
    """A package index on 127.0.0.1 that has no package: the URL, and the paths asked of it."""
    asked: list[str] = []

    class Nothing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            """No request lines in the test's output."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Nothing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()


def with_uv(env: dict[str, str]) -> dict[str, str]:
    uv_dir = str(Path(sys.executable).parent)  # uv comes with the test dependencies
    return env | {"PATH": f"{uv_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere PyPI's torch is a CPU build already")
def test_a_cpu_project_installs_torch_from_pytorchs_cpu_wheels(tmp_path):
    with package_index() as (index, asked):
        env = with_uv({FORCE: "1", CPU_WHEELS: f"{index}/whl/cpu", "UV_INDEX_URL": f"{index}/simple"})
        result = generate(tmp_path, env, timeout=120, setup_env="uv", smoke_test="yes", accelerator="cpu")
    assert f"accelerator=cpu: torch from PyTorch's CPU wheels ({index}/whl/cpu)" in result.stdout, result.stdout
    # The index has nothing, so the install stops there, at the command that asked it for torch.
    failed = next(line for line in result.stdout.splitlines() if line.startswith("Failed command:"))
    assert failed.endswith(f"pip install --python .venv/bin/python torch torchvision --index-url {index}/whl/cpu")
    assert "/whl/cpu/torch/" in asked
    # No terminal: the installer's lines go to the log only.
    assert "No solution found" not in result.stdout
    assert "No solution found" in (tmp_path / "image-classifier/runs/smoke-test/setup.log").read_text()


def test_on_a_terminal_the_installer_output_is_one_progress_line(tmp_path):
    primary, secondary = pty.openpty()
    with package_index() as (index, _):
        env = with_uv({FORCE: "1", CPU_WHEELS: f"{index}/whl/cpu", "UV_INDEX_URL": f"{index}/simple"})
        command = cookiecutter_command(tmp_path, accelerator="cpu")
        process = subprocess.Popen(command, stdout=secondary, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                   env=hook_env(env), start_new_session=True)  # fmt: skip
        os.close(secondary)
        chunks, deadline = [], time.monotonic() + 120
        try:
            with contextlib.suppress(OSError):  # EIO once every writer has closed the terminal
                while time.monotonic() < deadline:
                    if select.select([primary], [], [], 1)[0]:
                        chunks.append(os.read(primary, 4096))
                    elif process.poll() is not None:
                        break
            assert process.wait(timeout=10) == 0
        finally:
            os.close(primary)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    printed = b"".join(chunks).decode()
    # uv's two lines, each shown in place of the one before, then a newline; none printed on its own.
    assert "\r       2 lines, the last: cause: Because torch was not found" in printed, printed
    assert "\n    error: No solution found" not in printed


@pytest.mark.parametrize(
    ("accelerator", "cpu_index_up", "said"),
    [
        ("cpu", False, "PyTorch's CPU wheels: 127.0.0.1 cannot be reached"),
        ("gpu", True, None),  # a GPU project keeps the default, CUDA build, without asking
    ],
)
def test_a_cpu_index_out_of_reach_or_a_gpu_project_keeps_the_default_torch(tmp_path, accelerator, cpu_index_up, said):
    with package_index() as (index, asked):
        cpu_wheels = f"{index if cpu_index_up else CLOSED}/whl/cpu"
        env = {FORCE: "1", CPU_WHEELS: cpu_wheels, "UV_INDEX_URL": f"{CLOSED}/simple"}
        result = generate(tmp_path, with_uv(env), timeout=60, setup_env="uv", smoke_test="yes", accelerator=accelerator)
    assert "environment setup failed" in result.stdout  # the default index is closed too: nothing is installed
    assert ("CPU wheels" in result.stdout) is (said is not None) and (said or "") in result.stdout, result.stdout
    assert asked == []


@pytest.mark.parametrize(
    ("env", "reason"),
    [({"CI": "true"}, "CI is set"), ({}, "no terminal"), ({FORCE: "0"}, f"{FORCE}=0")],
)
def test_environment_and_smoke_test_are_skipped_without_a_person(tmp_path, env, reason):
    result = generate(tmp_path, env, setup_env="uv", smoke_test="yes")
    assert result.returncode == 0, result.stderr
    assert f"No environment or smoke test: {reason}" in result.stdout
    project = tmp_path / "image-classifier"
    assert (project / "pyproject.toml").is_file() and not (project / ".venv").exists()
    assert "python3 scripts/make_env.py uv" in result.stdout


@pytest.mark.parametrize("setup_env", ["venv", "current"])
def test_next_steps_run_without_a_python_command(tmp_path, setup_env):
    # Debian and Ubuntu have python3 but no `python` outside an activated environment. `current` is the
    # Python that ran cookiecutter: python3 was told, which lacked the project's packages.
    result = generate(tmp_path, {"CI": "true"}, setup_env=setup_env, smoke_test="yes")
    # The hook names make_env.py, which prints the rest once the environment exists (test_make_env.py).
    steps = [step.strip() for step in result.stdout.split("Next:")[1].splitlines()[2:] if step.strip()]
    python = sys.executable if setup_env == "current" else "python3"
    assert steps == [f"{python} scripts/make_env.py {setup_env} --smoke"]


def test_a_template_update_in_a_temporary_folder_runs_nothing_heavy():
    with tempfile.TemporaryDirectory() as folder:  # where cruft re-renders the template
        # Even when forced: cruft would diff a .venv and runs/ into the project.
        result = generate(Path(folder), {FORCE: "1"}, setup_env="uv", smoke_test="yes", timeout=120)
        assert "Rendered into a temporary folder" in result.stdout, result.stdout + result.stderr
        assert "Next:" not in result.stdout
        project = Path(folder) / "image-classifier"
        assert not (project / ".venv").exists()
        assert not (project / ".git").exists(), "cruft diffs the render: a repository in it breaks the update"


@pytest.mark.parametrize("setup_env", ["uv", "venv"])
def test_unreachable_package_index_fails_fast_and_keeps_the_project(tmp_path, setup_env):
    env = {FORCE: "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "UV_INDEX_URL": "http://127.0.0.1:9/simple"}
    # An installer left to its own retries would take minutes; the hook checks first and stops.
    result = generate(tmp_path, env, timeout=60, setup_env=setup_env, smoke_test="yes")
    assert result.returncode == 0 and (tmp_path / "image-classifier" / "pyproject.toml").is_file()
    assert "environment setup failed" in result.stdout
    assert "the package index 127.0.0.1 cannot be reached" in result.stdout
    assert "smoke test not run" in result.stdout and "smoke test failed" not in result.stdout
    assert not (tmp_path / "image-classifier" / ".venv").exists()


def test_a_ctrl_c_during_the_install_keeps_the_project_and_says_how_to_finish(tmp_path):
    # The hook and make_env.py each printed a traceback, and nothing said what to run.
    with socket.socket() as silent:  # an index that takes the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
        env = hook_env({FORCE: "1", "PIP_INDEX_URL": index, CPU_WHEELS: index})
        command = cookiecutter_command(tmp_path, setup_env="venv", smoke_test="yes")
        # As a terminal starts it, with Ctrl-C's default: a CI job's background shell may have it ignored.
        generation = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True,
                                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        try:
            log, deadline = tmp_path / "image-classifier/runs/smoke-test/setup.log", time.monotonic() + 120
            while not (log.is_file() and "Looking in indexes" in log.read_text()):  # pip runs, and waits on it
                assert generation.poll() is None and time.monotonic() < deadline, "pip never started"
                time.sleep(0.1)
            os.killpg(generation.pid, signal.SIGINT)  # a terminal's Ctrl-C: cookiecutter, the hook, the installer
            out, err = generation.communicate(timeout=60)  # until the hook, which outlives cookiecutter, is done
        finally:
            with contextlib.suppress(ProcessLookupError):  # all ended
                os.killpg(generation.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    project = tmp_path / "image-classifier"
    assert out.endswith("Setup interrupted. To finish it: python3 scripts/make_env.py venv --smoke\n"
                        f"The project is kept in {project}.\n"), out  # fmt: skip
    assert (project / "pyproject.toml").is_file()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_repository_with_first_commit(tmp_path):
    env = {"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com"}
    env |= {"GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@example.com"}
    result = generate(tmp_path, env, setup_env="none", smoke_test="no")
    project = tmp_path / "image-classifier"
    tracked = subprocess.run(["git", "ls-files"], cwd=project, capture_output=True, text=True).stdout.split()
    assert "first commit" in result.stdout and "configs/default.yaml" in tracked
    clean = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout
    assert clean == ""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_no_nested_repository_inside_an_existing_one(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    result = generate(tmp_path, {}, setup_env="none", smoke_test="no")
    assert "inside a git repository already" in result.stdout
    assert not (tmp_path / "image-classifier" / ".git").exists()


@pytest.mark.slow
def test_current_python_runs_the_smoke_test(tmp_path):
    result = generate(tmp_path, {FORCE: "1", "WANDB_MODE": "offline"}, setup_env="current", smoke_test="yes")
    assert result.returncode == 0, result.stderr
    assert "smoke test passed" in result.stdout, result.stdout
    project = tmp_path / "image-classifier"
    assert "then removed it" in result.stdout and not list(project.glob("runs/**/*.ckpt"))
    assert f"Setup log: {project / 'runs/smoke-test/setup.log'}" in result.stdout
    assert f"Full log: {project / 'runs/smoke-test/smoke.log'}" in result.stdout  # the project's own smoke test
    # On a CPU, the preset's bfloat16 autocast or float32, whichever this CPU computes faster (the
    # project's hardware/rules.py, which its test_hardware_rules.py checks machine by machine).
    ran = r"Ran fast_dev_run on the CPU \(accelerator auto, devices 1, strategy auto, precision (bf16-mixed|32-true)\)"
    assert re.search(ran, result.stdout), result.stdout
    assert f"PYTHONPATH=src {sys.executable} -m image_classifier fit" in result.stdout


@pytest.mark.slow
def test_failed_smoke_test_keeps_the_project_and_points_at_the_log(tmp_path):
    env = {FORCE: "1", "WANDB_MODE": "offline"}
    # A timm ViT takes its own image size only, which generation does not check (it checks
    # torchvision's models' sizes): the first fit does.
    vit = "timm/vit_tiny_patch16_224"
    result = generate(tmp_path, env, setup_env="current", smoke_test="yes", backbone=vit, image_size="64")
    project = tmp_path / "image-classifier"
    assert result.returncode == 0 and (project / "pyproject.toml").is_file()
    assert "smoke test failed" in result.stdout and "Next:" not in result.stdout
    assert f"Setup log: {project / 'runs/smoke-test/setup.log'}" in result.stdout
    assert f"{vit} cannot take 64-pixel images" in result.stdout and "--data.image_size 224" in result.stdout


@pytest.mark.slow
def test_current_python_without_torch_names_what_is_missing_and_the_command_that_installs_it(tmp_path):
    bare = tmp_path / "bare"  # a Python with cookiecutter and nothing else
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True)
    python = bare / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "cookiecutter"], check=True, timeout=600)
    command = cookiecutter_command(tmp_path / "out", python, setup_env="current", smoke_test="yes")
    result = run_bounded(command, 300, env=hook_env({FORCE: "1"}), stdin=subprocess.DEVNULL)
    project = tmp_path / "out" / "image-classifier"
    assert result.returncode == 0 and "environment setup failed" in result.stdout, result.stdout + result.stderr
    install = f"{python} -m pip install -e '.[dev]'"
    assert "lacks lightning, torch, torchvision, " in result.stdout and install in result.stdout
    log = (project / "runs" / "smoke-test" / "setup.log").read_text()
    assert "lacks lightning, torch, torchvision, " in log and install in log, "the log it names must say it too"


@pytest.mark.slow
def test_fresh_uv_environment_passes_the_smoke_test(tmp_path):
    """The whole path with a new .venv made by uv (its package cache makes repeated runs quick)."""
    env = with_uv({FORCE: "1", "WANDB_MODE": "offline"})
    result = generate(tmp_path, env, setup_env="uv", smoke_test="yes")
    assert "smoke test passed" in result.stdout, result.stdout[-5000:] + result.stderr[-3000:]
    project = tmp_path / "image-classifier"
    python = project / ".venv" / "bin" / "python"
    assert subprocess.run([python, "-c", "import image_classifier, pytest"], cwd=tmp_path).returncode == 0
    assert ". .venv/bin/activate && python -m image_classifier fit" in result.stdout


def test_gitignore_keeps_data_runs_checkpoints_logs_and_secrets_out(tmp_path):
    project = render(tmp_path)
    ignored = [
        "data/shapes/train/circle/0001.png",
        "runs/p/version_0/checkpoints/last.ckpt",
        "model.ckpt",
        "wandb/offline-run-1/run-1.wandb",
        "lightning_logs/version_0/hparams.yaml",
        "slurm-42.out",
        ".env",
    ]
    kept = ["src/image_classifier/model.py", "configs/trainer/ddp.yaml", "scripts/slurm.sbatch", "README.md"]
    checked = subprocess.run(["git", "check-ignore", *ignored, *kept], cwd=project, capture_output=True, text=True)
    assert checked.stdout.split() == ignored
