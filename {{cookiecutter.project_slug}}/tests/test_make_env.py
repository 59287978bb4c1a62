"""scripts/make_env.py, the environment step of the project's generation, which users rerun."""

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

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
    assert f"# Using {sys.executable} as it is" in (tmp_path / "runs" / "smoke-test" / "setup.log").read_text()
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


def test_current_names_each_dependency_missing_or_out_of_range(tmp_path):
    # It looked for eight modules and not the logger's package, nor at versions: the smoke test then failed.
    script = copy_of_the_project_files(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    # Three on one line: one in single quotes, and one for another platform, which is left out.
    pyproject.write_text(pyproject.read_text().replace(
        '    "torch>=2.6",', """    'torch>=99.1', "no-such-distribution>=1", "pywin32>=300; sys_platform == 'nt'",""")
    )  # fmt: skip
    done = subprocess.run([sys.executable, script, "current"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    lacks = f"this Python lacks torch {importlib.metadata.version('torch')}, not >=99.1, no-such-distribution: install"
    assert lacks in done.stdout, done.stdout


def test_current_refuses_a_python_older_than_the_project_takes(tmp_path):
    # It used this Python whatever requires-python said, and the smoke test passed on it.
    script = copy_of_the_project_files(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    newer = f"3.{sys.version_info.minor + 1}"
    requires = f'requires-python = ">={newer}"'
    pyproject.write_text(re.sub(r'requires-python = ">=[^"]*"', requires, pyproject.read_text()))
    done = subprocess.run([sys.executable, script, "current", "--smoke"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    said = f"Likely fix: this Python is {sys.version.split()[0]} and the project needs {newer}+: run this with a newer"
    assert said in done.stdout and "smoke test not run" in done.stdout, done.stdout


def test_a_ctrl_c_during_the_install_says_how_to_finish_it(tmp_path):
    script = copy_of_the_project_files(tmp_path)
    with socket.socket() as silent:  # an index that takes the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
        env = {"PATH": "/usr/bin:/bin", "PIP_INDEX_URL": index, "LIGHTNING_TEMPLATE_CPU_WHEELS": index}
        # As a terminal starts it, with Ctrl-C's default: a CI job's background shell may have it ignored.
        setup = subprocess.Popen([sys.executable, script, "venv", "--smoke"], stdout=subprocess.PIPE, text=True,
                                 env=env, start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            log = tmp_path / "runs/smoke-test/setup.log"
            while not (log.is_file() and "Looking in indexes" in log.read_text()):  # pip runs, and waits on it
                assert setup.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            os.killpg(setup.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the installer too
            rest = setup.communicate(timeout=60)[0]
        finally:
            setup.kill()
    assert setup.returncode == 130, rest
    assert rest.endswith("Setup interrupted. To finish it: python3 scripts/make_env.py venv --smoke\n"), rest


def test_a_ctrl_c_of_current_says_to_finish_with_this_python(monkeypatch, capsys, tmp_path):
    # It said python3, which may lack the project's packages that this Python has.
    spec = importlib.util.spec_from_file_location("make_env", copy_of_the_project_files(tmp_path))
    make_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_env)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(make_env, "make_and_check", interrupted)
    monkeypatch.setattr(sys, "argv", ["make_env.py", "current", "--smoke"])
    monkeypatch.chdir(tmp_path)  # where main goes, the project's folder: back after the test
    assert make_env.main() == 130
    assert capsys.readouterr().out.endswith(f"To finish it: {sys.executable} scripts/make_env.py current --smoke\n")


def test_a_python_of_the_projects_version_that_does_not_run_is_named_with_its_fix(tmp_path):
    # pyenv's shim of a version it has not selected: venv failed on it with the last line of pyenv's help.
    script = copy_of_the_project_files(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(re.sub(r'requires-python = ">=3\.\d+"', 'requires-python = ">=3.99"', pyproject.read_text()))
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3.99").write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
    (shims / "python3.99").chmod(0o755)
    with socket.socket() as index:  # an index that is there, for the check before the install
        index.bind(("127.0.0.1", 0))
        index.listen()
        env = {"PATH": f"{shims}:/usr/bin:/bin", "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple"}
        env["LIGHTNING_TEMPLATE_CPU_WHEELS"] = env["PIP_INDEX_URL"]
        done = subprocess.run([sys.executable, script, "venv"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    fix = (f"Likely fix: {shims}/python3.99 does not run (pyenv: python3.99: command not found): select or install "
           "Python 3.99 (with pyenv: pyenv shell 3.99), or run this with Python 3.99+")  # fmt: skip
    assert fix in done.stdout, done.stdout
