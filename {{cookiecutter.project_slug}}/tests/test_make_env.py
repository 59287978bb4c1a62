"""scripts/make_env.py, the environment step of the project's generation, which users rerun."""

import importlib.util
import shutil
import subprocess
import sys

from conftest import PROJECT_ROOT


def copy_of_the_project_files(folder):
    for name in ("scripts/make_env.py", "pyproject.toml", ".cookiecutter.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT_ROOT / name, folder / name)
    return folder / "scripts" / "make_env.py"


def test_current_checks_this_python_and_installs_nothing(tmp_path):
    script = copy_of_the_project_files(tmp_path)
    done = subprocess.run([sys.executable, script, "current"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"Using {sys.executable} as it is") and not (tmp_path / ".venv").exists()
    assert f"# Using {sys.executable} as it is" in (tmp_path / "runs" / "setup.log").read_text()
    # Then what to run with that Python, which `python` may not be, and which may lack pytest-xdist.
    assert done.stdout.endswith(f"PYTHONPATH=src {sys.executable} -m pytest\n"), done.stdout


def test_after_a_venv_the_next_steps_activate_it(capsys):
    # Debian and Ubuntu have python3 but no `python` outside an activated environment.
    spec = importlib.util.spec_from_file_location("make_env", PROJECT_ROOT / "scripts" / "make_env.py")
    make_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_env)
    make_env.print_next_steps(make_env.VENV_PYTHON)
    steps = capsys.readouterr().out.split("Next:")[1].splitlines()[2:]
    commands = ["{{ cookiecutter.package_name }} doctor", "{{ cookiecutter.package_name }} fit", "pytest -n auto"]
    assert steps == [f"  . .venv/bin/activate && python -m {command}" for command in commands]


def test_an_index_out_of_reach_stops_in_seconds_and_names_it(tmp_path):
    script = copy_of_the_project_files(tmp_path)
    closed = "http://127.0.0.1:9/simple"  # a closed port on this machine
    env = {"PATH": "/usr/bin:/bin", "PIP_INDEX_URL": closed, "UV_INDEX_URL": closed}
    env["LIGHTNING_TEMPLATE_CPU_WHEELS"] = "http://127.0.0.1:9/whl/cpu"
    done = subprocess.run([sys.executable, script, "venv"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert "Failed command: (package index)" in done.stdout
    assert "Likely fix: the package index 127.0.0.1 cannot be reached" in done.stdout
    assert not (tmp_path / ".venv").exists()
