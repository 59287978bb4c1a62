"""`doctor --smoke`: the smoke test the project was generated with, rerun by the user."""

import importlib.util
import re
import shlex
import sys

import yaml
from conftest import PROJECT_ROOT, command_env, run_group

# The smoke test's fallback from GPUs to the CPU trains in {{ "the precision this CPU computes fastest (hardware/rules.py,\n# whose test_hardware_rules.py checks it machine by machine)" if cookiecutter.precision == "bf16-mixed" else "float32: " + cookiecutter.precision + (" is emulated on a CPU, far slower" if cookiecutter.precision == "16-mixed" else ", as configured") }}.
CPU_PRECISION = {{ '"(bf16-mixed|32-true)"' if cookiecutter.precision == "bf16-mixed" else '"32-true"' }}
DOCTOR_SMOKE = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "doctor", "--smoke"]


def small_data(folder, tiny_shapes, **data) -> str:
    config = folder / "small.yaml"
    data = {"data_dir": str(tiny_shapes), "synthetic": False, "num_workers": 0, "batch_size": 8} | data
    config.write_text(yaml.safe_dump({"data": data}))
    return f"--config={config}"


def load_make_env():
    spec = importlib.util.spec_from_file_location("make_env", PROJECT_ROOT / "scripts" / "make_env.py")
    make_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_env)
    return make_env


def test_missing_gpus_fall_back_to_the_cpu_and_the_checkpoint_reloads(capsys, in_project_copy, tiny_shapes):
    command = [*DOCTOR_SMOKE, "--config=configs/trainer/gpu.yaml", small_data(in_project_copy, tiny_shapes)]
    done = run_group(command, 600, cwd=in_project_copy, env=command_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    cpu = re.escape("the CPU (accelerator cpu, devices 1, strategy auto, precision ") + CPU_PRECISION + r"\)"
    fell_back = f"FALLBACK: accelerator gpu, but no CUDA GPU is visible: the smoke test runs on {cpu} instead."
    assert any(re.fullmatch(fell_back, line) for line in lines), lines
    assert any(re.match(f"Ran fast_dev_run on {cpu}: ", line) for line in lines), lines
    assert "reloaded its checkpoint runs/smoke-test/version_0/checkpoints/last.ckpt, then removed it" in lines[-4]
    # It passed on the CPU, where a plain fit is refused: the next steps train with what the smoke test ran.
    assert lines[-3].startswith("Passed on the fallback, not on the configured hardware. On this machine, fit with: ")
    make_env = load_make_env()
    here = next(line.partition(make_env.HERE)[2] for line in lines if make_env.HERE in line)
    assert "--trainer.accelerator=cpu" in here.split()
    make_env.print_next_steps(make_env.VENV_PYTHON, here)
    assert f"python -m {{ cookiecutter.package_name }} fit {here}\n" in capsys.readouterr().out
    # Removed, so that the commands which take the newest run ({{ "classify, report" if cookiecutter.inference == "yes" else "report, evaluations" }}) take a real one.
    assert not list(in_project_copy.glob("runs/**/*.ckpt"))
    assert lines[-2:] == [f"Full log: {in_project_copy / 'runs/smoke-test/smoke.log'}", "smoke test passed"]
    log = (in_project_copy / "runs/smoke-test/smoke.log").read_text()
    assert "--trainer.accelerator=cpu" in log and "--trainer.fast_dev_run=true" in log


def test_a_failing_step_names_its_command_and_the_fix(in_project_copy, tiny_shapes):
    broken = small_data(in_project_copy, tiny_shapes, data_dir=str(in_project_copy / "no-such-folder"))
    on_cpu = "--config=configs/trainer/cpu.yaml"  # whatever hardware the project was generated for
    env = command_env()
    done = run_group([*DOCTOR_SMOKE, on_cpu, broken], 300, cwd=in_project_copy, env=env)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[-5] == "Failed: Smoke test 1/2: fast_dev_run (one batch of training and validation)"
    # As it ran, to copy: with the PYTHONPATH that makes the package importable where it is not installed,
    # and the precision this CPU runs fast appended where the configured one would be emulated.
    command = f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} {sys.executable} -m {{ cookiecutter.package_name }} fit"
    assert lines[-4].startswith(f"Command: {command} {on_cpu} {broken} "), lines[-4]
    assert f"$ {command} {on_cpu} {broken} " in (in_project_copy / "runs/smoke-test/smoke.log").read_text()
    assert "--trainer.fast_dev_run=true" in lines[-4].split()
    assert lines[-3].startswith("Likely fix: the last line of the log says: error: ") and "no-such-folder" in lines[-3]
    assert lines[-1] == "smoke test failed"
