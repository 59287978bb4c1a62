"""The template validated on an NVIDIA GPU, every figure in one markdown report.

On a lent GPU machine (the device tool: one call a part, each under 8 minutes), from the
template's root, with the wheels of benchmarks/gpu_wheels.py carried in .whl/:

    python3 benchmarks/gpu_validation.py --part 1 --out "$OUT"     # then --part 2, 3, 4

Here, on the CPU, the same steps at toy sizes, which the tests run so that the script cannot rot
before a GPU is lent (a plain and a sharded run train, the other runs are only parsed, and the
report says so):

    .venv/bin/python benchmarks/gpu_validation.py --part all --dry-run --out /tmp/gpu-dry-run

1. setup and deployment: the carried wheels installed into a site folder; the template rendered
   with accelerator=gpu and setup_env=current, its post-generation smoke test forced to run, the
   hook's whole summary kept; `export` to ONNX, the checkpoint on CUDA against its export and
   against the CPU, `classify --device cuda` against `--device cpu`.
2. the generated project's GPU tests (pytest -m gpu).
3. presets: each trainer preset on one GPU, then each precision and speed switch against the gpu
   preset: one epoch of 40 steps, validated and checkpointed; time, images/s, peak memory.
4. speed: `benchmark train` for resnet18 and resnet50 at 224 px (images/s, MFU), the same models
   alone on synthetic batches (as published figures are measured), `benchmark data` with up to 16
   workers on JPEGs, and benchmarks/parity.py.

Each part writes part<N>.json into --out and --work as each check ends (a part cut off at the
device tool's limit keeps what it measured), and at its end --out/gpu-validation.md from every part
found in either; `--report PART.json ... --output FILE` merges parts that came back from separate
machines.
"""

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gpu_wheels
from rendered import render_project

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
PACKAGE = "image_classifier"  # the default answers' package
# A part starts no check past PART_SECONDS, and cuts a check short at HARD_SECONDS, so that it ends
# inside the device tool's 10-minute call.
PART_SECONDS, HARD_SECONDS = 450, 560
# Published single-GPU training figures for resnet50 (224 px, mixed precision, channels_last, synthetic or DALI data).
ANCHORS = {
    "timm, A100, AMP + channels_last, synthetic": 2600,
    "NVIDIA DeepLearningExamples, A100 80GB, AMP": 2470,
}
PRESETS = ("gpu", "ddp", "fsdp", "fsdp1", "deepspeed_stage2", "deepspeed_stage3_offload")
# A plain and a sharded run: the other runs of part 3 take the same code path, and some need CUDA
# (FSDP1, DeepSpeed, float16) or minutes of a CPU (compile); the dry run parses them.
TRAINED_IN_THE_DRY_RUN = {"preset gpu", "preset fsdp"}
# Each part is one device call of under 8 minutes: its title and its steps, methods of Validation.
PARTS = {
    1: ("Setup and deployment", ("setup", "deployment")),
    2: ("The generated project's GPU tests", ("gpu_tests",)),
    3: ("Presets, precisions and speed switches, on one GPU", ("presets",)),
    4: ("Speed", ("speed",)),
}
# The report's columns for a part whose checks all give the same figures (the others list theirs).
COLUMNS = {
    3: ["steps", "ms/step", "images/s", "peak GiB", "precision", "strategy", "loss", "val/acc", "last checkpoint"]
}


@dataclass
class Check:
    part: int
    name: str
    status: str  # passed, failed, parsed only (dry run), skipped
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)
    note: str = ""
    command: str = ""
    output: str = ""  # kept in the report for failures and for what is worth reading whole


@dataclass
class Settings:
    """What differs between a GPU run and the CPU dry run."""

    dry: bool
    steps: int  # training steps of each preset run (one epoch), and of benchmark train after its warmup
    warmup: int  # untimed steps before them
    batch: int  # preset runs
    image_size: int
    speed_batch: int  # benchmark train and the model alone
    speed_backbones: tuple[str, ...]
    shapes: tuple[int, int]  # drawn images per class, and copies of each: enough for every run in one epoch
    jpegs: tuple[int, int, int]  # the same for benchmark data's JPEGs, and their side in pixels
    workers: str  # benchmark data's worker counts
    data_batches: int  # timed by benchmark data per worker count

    @classmethod
    def for_run(cls, dry: bool) -> "Settings":
        if dry:
            return cls(dry, 3, 1, 8, 32, 8, ("resnet18",), (4, 2), (4, 2, 64), "0,1", 3)
        # 2,400 x 6 training images: 56 batches of 256, so benchmark train's 50 steps and benchmark
        # data's 21 batches stay within one epoch; JPEGs are drawn at 26 ms each, so fewer, linked 10 times.
        return cls(dry, 40, 10, 128, 224, 256, ("resnet18", "resnet50"), (400, 6), (100, 10, 256), "0,4,8,16", 20)

    @property
    def hardware(self) -> list[str]:
        """What every run adds: the CPU and 32-true in the dry run (no data workers: they cost start-up there)."""
        if self.dry:
            return ["--trainer.accelerator=cpu", "--trainer.precision=32-true", "--data.num_workers=0"]
        return []

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"


class Validation:
    def __init__(self, settings: Settings, work: Path, out: Path, wheels: Path) -> None:
        self.settings, self.work, self.out, self.wheels = settings, work, out, wheels
        self.site = work / "site"
        self.checks: list[Check] = []
        self.part, self.facts = 0, {}
        self.deadline = self.hard_end = float("inf")

    def start(self, part: int) -> None:
        self.part = part
        if not self.site.is_dir():  # the first part on this machine: its versions are those of the carried wheels
            self.install_wheels()
        self.facts = machine(self.env())
        if not self.settings.dry:
            self.deadline, self.hard_end = time.monotonic() + PART_SECONDS, time.monotonic() + HARD_SECONDS

    # --- running commands ---

    def env(self, project: Path | None = None) -> dict[str, str]:
        paths = [str(self.site), str(BENCHMARKS)] + ([str(project / "src")] if project else [])
        inherited = os.environ.get("PYTHONPATH")
        return os.environ | {
            "PYTHONPATH": os.pathsep.join(paths + ([inherited] if inherited else [])),
            "PYTHONUNBUFFERED": "1",
            "WANDB_MODE": "offline",
            "MASTER_ADDR": "127.0.0.1",
        }

    def run(self, name: str, command: list, cwd: Path, project: Path | None = None, timeout: float = 300,
            **extra: str) -> Check:  # fmt: skip
        """Run `command` and record it as a check: passed when it exits 0 within `timeout` seconds."""
        shown = " ".join(shlex.quote(str(arg)) for arg in command)
        left = self.hard_end - time.monotonic()
        if time.monotonic() > self.deadline or left < 30:
            return self.add(Check(self.part, name, "skipped", note="the part's time ran out", command=shown))
        print(f"[part {self.part}] {name} ...", flush=True)
        started = time.monotonic()
        returncode, output = self.execute(command, cwd, project, min(timeout, left), **extra)
        status = "passed" if returncode == 0 else "failed"
        note = {0: "", None: f"did not end within {min(timeout, left):.0f} s"}.get(
            returncode, f"exit status {returncode}"
        )
        seconds = time.monotonic() - started
        return self.add(Check(self.part, name, status, seconds, note=note, command=shown, output=output))

    def execute(self, command: list, cwd: Path, project: Path | None, timeout: float, **extra: str):
        """(exit status, or None when it ran out of time; its output) of `command`, run in a process
        group of its own: a hang or a leftover rank is killed with it."""
        process = subprocess.Popen(
            [str(arg) for arg in command], cwd=cwd, env=self.env(project) | extra, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
            returncode = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            returncode = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return returncode, output

    def add(self, check: Check) -> Check:
        """Keep a check, and the part's results so far on disk."""
        self.checks.append(check)
        self.save()
        return check

    def save(self) -> None:
        checks = [check for check in self.checks if check.part == self.part]
        result = {"part": self.part, "dry_run": self.settings.dry, "machine": self.facts,
                  "checks": [asdict(check) for check in checks]}  # fmt: skip
        for folder in (self.work, self.out):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"part{self.part}.json").write_text(json.dumps(result, indent=1))

    # --- the project and its data ---

    def project(self) -> Path:
        """The project the parts train: accelerator=gpu, CSV logs, `tune` and `benchmark` (part 4 runs the
        latter), no environment of its own (rendered once per machine, with the carried cookiecutter)."""
        project = self.work / "project" / "image-classifier"
        if not project.is_dir():
            render_project(project.parent, "accelerator=gpu", "tuning=yes", env=self.env())
        return project

    def images(self, name: str, per_class: int, copies: int, side: int, suffix: str) -> list[str]:
        """The options of a drawn data set of the built-in shapes (once per machine)."""
        folder = self.work / name
        if not folder.is_dir():
            draw = [sys.executable, BENCHMARKS / "gpu_checks.py", "images", folder, f"--per-class={per_class}",
                    f"--copies={copies}", f"--size={side}", f"--suffix={suffix}"]  # fmt: skip
            self.run(
                f"draw {name}: {per_class} x {copies} images per class, {side} px", draw, self.work, self.project()
            )
        return [f"--data.data_dir={folder}", "--data.synthetic=false"]

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", PACKAGE, *args]

    # --- setup ---

    def install_wheels(self) -> None:
        """The carried wheels this Python lacks, into the site folder every command has on its path."""
        started = time.monotonic()
        self.site.mkdir(parents=True)
        if any(self.wheels.glob("*.whl")):
            installed = gpu_wheels.install(self.wheels, self.site)
            status, note = "passed", f"installed: {', '.join(installed)}" if installed else "all were here already"
        else:
            status, note = "skipped", f"none in {self.wheels}: this Python's packages"
        self.add(Check(self.part, "carried wheels", status, time.monotonic() - started, note=note))

    def setup(self) -> None:
        hooked = self.work / "hooked"
        check = self.run(
            "generate with accelerator=gpu, setup_env=current, smoke test forced",
            [sys.executable, "-m", "cookiecutter", "--no-input", "-f", ROOT, "-o", hooked, "accelerator=gpu",
             "setup_env=current"],
            cwd=self.work, LIGHTNING_TEMPLATE_SETUP="1",
        )  # fmt: skip
        summary = check.output[check.output.find("====") :] if "====" in check.output else check.output
        check.output = summary
        if check.status == "passed" and "smoke test passed" not in summary:
            check.status, check.note = "failed", "the hook's summary does not end in 'smoke test passed'"
        ran = next((line for line in summary.splitlines() if line.startswith("Ran ")), "")
        check.figures["smoke test"] = ran.removeprefix("Ran ")
        self.save()

    # --- deployment ---

    def deployment(self) -> None:
        project, s = self.project(), self.settings
        runs = project / "runs" / "deploy"
        trained = self.run("fit for the deployment checks",
                           self.command("fit", "--config=configs/trainer/gpu.yaml", *s.hardware,
                                        "--trainer.max_epochs=1", "--trainer.limit_train_batches=10",
                                        "--trainer.limit_val_batches=2", f"--trainer.logger.init_args.save_dir={runs}"),
                           project, project)  # fmt: skip
        checkpoints = sorted(runs.glob("**/checkpoints/epoch*.ckpt"))
        if trained.status != "passed" or not checkpoints:
            self.add(Check(self.part, "deployment", "skipped", note="no checkpoint to deploy"))
            return
        checkpoint, onnx = checkpoints[-1], self.work / "model.onnx"
        exported = self.run("export --format onnx (checked against PyTorch by onnxruntime on the CPU)",
                            self.command("export", checkpoint, "--output", onnx), project, project)  # fmt: skip
        found = re.search(r"Largest difference from PyTorch on \d+ real images: ([0-9.e+-]+)", exported.output)
        exported.figures = {"max diff onnx-pytorch": float(found.group(1))} if found else {}
        exported.output = tail(exported.output, 6)
        images = project / "data" / "shapes" / "val"
        if exported.status == "passed":
            compared = self.run(f"checkpoint on {s.device} against its ONNX export and against the CPU",
                                [sys.executable, BENCHMARKS / "gpu_checks.py", "predictions", checkpoint, onnx, images,
                                 f"--device={s.device}"], project, project)  # fmt: skip
            compared.figures = last_json(compared.output)
        devices = [s.device, "cpu"]
        tables = [self.work / f"classified-{index}-{where}.csv" for index, where in enumerate(devices)]
        for table, where in zip(tables, devices, strict=True):
            table.unlink(missing_ok=True)
            self.run(f"classify --device {where}", self.command("classify", images, "--checkpoint", checkpoint,
                                                                   "--device", where, "--output", table),
                     project, project)  # fmt: skip
        if all(path.is_file() for path in tables):
            figures = compare_predictions(*(read_predictions(path) for path in tables))
            status = "passed" if figures["other top-1 beyond a tie"] == 0 else "failed"
            self.add(Check(self.part, f"classify: {s.device} against cpu", status, figures=figures))

    # --- the generated project's GPU tests ---

    def gpu_tests(self) -> None:
        project = self.project()
        # Only their file: the others import extras (optuna, litdata, litserve) the GPU machine lacks.
        tests = self.run("the project's GPU tests (pytest -m gpu)",
                         [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                          "tests/test_gpu.py"], cwd=project, project=project, timeout=480)  # fmt: skip
        counts = re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", tests.output)
        tests.figures = {kind: int(number) for number, kind in counts}
        if tests.status == "passed" and not self.settings.dry and not tests.figures.get("passed"):
            tests.status, tests.note = "failed", "no GPU test ran"
        tests.output = tail(tests.output, 60) if tests.status == "failed" or self.settings.dry else ""
        self.save()

    # --- presets, precisions and speed switches ---

    def preset_runs(self) -> list[tuple[str, list[str]]]:
        """(name, options) of each run: the presets on one device, then one change at a time against
        the gpu preset (bf16-mixed, channels_last on, compile off, automatic worker count). The gpu
        preset with 8 workers comes second: its step slowed from 22 to 28 ms when `auto` went from at
        most 8 workers to at most 16, and a call cut short should still answer whether that is why."""
        gpu = "--config=configs/trainer/gpu.yaml"
        presets = [
            (f"preset {name}", [f"--config=configs/trainer/{name}.yaml", "--trainer.devices=1"]) for name in PRESETS
        ]
        return [
            presets[0],
            ("gpu, 8 data workers", [gpu, "--data.num_workers=8"]),
            *presets[1:],
            ("gpu, 16-mixed", [gpu, "--trainer.precision=16-mixed"]),
            ("gpu, 32-true (TF32 on, as configured)", [gpu, "--trainer.precision=32-true"]),
            ("gpu, compile_mode default", [gpu, "--model.compile_mode=default"]),
            ("gpu, channels_last off", [gpu, "--model.channels_last=false"]),
        ]

    def presets(self) -> None:
        project, s = self.project(), self.settings
        data = self.images("shapes", *s.shapes, 64, "png")
        runs = {}
        for name, options in self.preset_runs():
            record = self.work / "records" / f"{re.sub(r'[^a-z0-9]+', '-', name)}.json"
            record.unlink(missing_ok=True)
            probe = {"class_path": "gpu_checks.RunRecord", "init_args": {"path": str(record), "warmup": s.warmup}}
            one_epoch = ["--trainer.max_epochs=1", f"--trainer.limit_train_batches={s.steps}",
                         "--trainer.limit_val_batches=2", f"--data.batch_size={s.batch}",
                         f"--data.image_size={s.image_size}", *data,
                         f"--trainer.callbacks+={json.dumps(probe)}"]  # fmt: skip
            runs[name] = record, [*options, *one_epoch]
        refusals = {}
        if s.dry:  # one process parses the runs the dry run does not train: each on its own would import everything
            untrained = {name: args for name, (_, args) in runs.items() if name not in TRAINED_IN_THE_DRY_RUN}
            parse = [sys.executable, BENCHMARKS / "gpu_checks.py", "parse", json.dumps(untrained)]
            _, output = self.execute(parse, project, project, 300)
            refusals = last_json(output) or dict.fromkeys(untrained, tail(output, 20) or "the parse gave no answer")
        for name, (record, args) in runs.items():
            if name in refusals:
                refused = refusals[name]
                status, note = ("failed", refused) if refused else ("parsed only", "trained on a GPU only")
                self.add(Check(self.part, name, status, note=note, command=shlex.join(["fit", *args])))
                continue
            check = self.run(name, self.command("fit", *args, *s.hardware), project, project)
            if record.is_file():
                check.figures = json.loads(record.read_text())
            elif check.status == "passed":
                check.status, check.note = "failed", "the run wrote no record"
            if check.status == "passed":
                check.output = ""
            self.save()

    # --- speed ---

    def speed(self) -> None:
        project, s = self.project(), self.settings
        shapes = self.images("shapes", *s.shapes, 64, "png")
        per_class, copies, side = s.jpegs
        jpegs = self.images("jpegs", per_class, copies, side, "jpg")
        speed = ["--config=configs/trainer/gpu.yaml", f"--data.image_size={s.image_size}",
                 f"--data.batch_size={s.speed_batch}", *s.hardware]  # fmt: skip
        steps = [f"--steps={s.steps}", f"--warmup={s.warmup}"]
        precision = "32-true" if s.dry else "bf16-mixed"
        for backbone in s.speed_backbones:
            check = self.run(f"benchmark train {backbone}, {s.image_size} px, batch {s.speed_batch}",
                             self.command("benchmark", "train", *steps, f"--model.backbone={backbone}", *speed,
                                          *shapes), project, project)  # fmt: skip
            check.figures = figures_of_benchmark_train(check.output)
            alone = self.run(f"{backbone} alone, synthetic batches on the device",
                             [sys.executable, BENCHMARKS / "gpu_checks.py", "model-alone", f"--backbone={backbone}",
                              f"--image-size={s.image_size}", f"--batch-size={s.speed_batch}", *steps,
                              f"--device={s.device}", f"--precision={precision}"],
                             project, project)  # fmt: skip
            alone.figures = last_json(alone.output)
            if check.figures.get("images/s") and alone.figures.get("images/s"):
                share = check.figures["images/s"] / alone.figures["images/s"]
                check.figures["share of the model alone"] = round(share, 3)
            self.save()
        data = self.run(f"benchmark data, JPEGs ({s.image_size} px crops), workers {s.workers}",
                        self.command("benchmark", "data", f"--workers={s.workers}", f"--batches={s.data_batches}",
                                     *speed, *jpegs), project, project)  # fmt: skip
        data.figures = {f"{workers} workers": rate for workers, rate in loader_speeds(data.output)}
        # With workers, as a GPU trains: with none, both loops wait on decoding in the main process.
        parity_steps = (
            ["--steps=2", "--warmup=1", "--repeats=1"] if s.dry else ["--steps=50", "--warmup=10", "--num-workers=8"]
        )
        parity = self.run("parity.py: the project's fit, as configured, against a plain PyTorch loop",
                          [sys.executable, BENCHMARKS / "parity.py", *parity_steps, f"--precision={precision}"],
                          ROOT)  # fmt: skip
        found = re.search(r"lightning / plain \(median ms/step\): (\d+\.\d+)x", parity.output)
        parity.figures = {"lightning / plain": float(found.group(1))} if found else {}
        parity.output = parity.output if parity.status == "failed" else tail(parity.output, 12)
        self.save()


def tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def last_json(output: str) -> dict:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def figures_of_benchmark_train(output: str) -> dict:
    figures = {}
    if found := re.search(r"(\d+) images/s \((\d+) per process\), ([\d.]+) ms/step", output):
        figures |= {"images/s": int(found.group(1)), "ms/step": float(found.group(3))}
    if found := re.search(r"MFU ([\d.]+) % of (.*)'s (\d+) TFLOP/s", output):
        figures |= {"MFU %": float(found.group(1)), "peak TFLOP/s": int(found.group(3))}
    return figures


def loader_speeds(output: str) -> list[tuple[int, int]]:
    return [(int(w), int(s)) for w, s in re.findall(r"^\s+(\d+)\s+(\d+)\s*$", output, re.MULTILINE)]


def read_predictions(path: Path) -> dict[str, tuple[str, float, float]]:
    """Each image's top class, its probability and the runner-up's, from classify's CSV."""
    with path.open() as file:
        rows = list(csv.reader(file))
    return {row[0]: (row[1], float(row[2]), float(row[4])) for row in rows[1:]}


def compare_predictions(first: dict, second: dict, tie: float = 0.01) -> dict:
    """How two runs' top classes agree. A differing top class counts only beyond a tie: where the
    second run's two best were further apart than `tie` (TF32 on a GPU moves probabilities by ~1e-3)."""
    differ = [name for name in first if first[name][0] != second[name][0]]
    beyond_tie = [name for name in differ if second[name][1] - second[name][2] > tie]
    return {
        "images": len(first),
        "same top-1": 1 - len(differ) / max(1, len(first)),
        "other top-1 beyond a tie": len(beyond_tie),
        "max diff of top-1 p": max((abs(first[n][1] - second[n][1]) for n in first if n not in differ), default=0.0),
    }


def machine(env: dict[str, str]) -> dict[str, str]:
    """Versions and hardware, read in a fresh process that sees the carried packages."""
    probe = r"""
import json, platform, torch, lightning, torchvision, importlib.metadata as m
facts = {"python": platform.python_version(), "torch": torch.__version__, "CUDA": torch.version.cuda or "none",
         "cuDNN": str(torch.backends.cudnn.version()), "lightning": lightning.__version__,
         "torchvision": torchvision.__version__}
for name in ("deepspeed", "jsonargparse", "onnxruntime", "wandb", "cookiecutter"):
    try: facts[name] = m.version(name)
    except m.PackageNotFoundError: facts[name] = "not installed"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    facts |= {"GPU": p.name, "GPU memory GiB": f"{p.total_memory / 2**30:.0f}", "GPUs": str(torch.cuda.device_count())}
print(json.dumps(facts))
"""
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    facts = last_json(done.stdout) if done.returncode == 0 else {"probe": done.stderr[-300:]}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None  # fmt: skip
    facts["driver"] = smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0 else "none"
    facts["CPUs"] = str(os.cpu_count())
    facts["platform"] = platform.platform()
    return facts


def report(parts: list[dict]) -> str:
    """The markdown report of the parts' results."""
    parts = sorted(parts, key=lambda part: part["part"])
    lines = ["# GPU validation", ""]
    if any(part["dry_run"] for part in parts):
        lines += ["**Dry run on the CPU**: the script's steps at toy sizes; runs marked parsed only were not trained. "
                  "No figure here says anything about a GPU.", ""]  # fmt: skip
    facts = parts[-1]["machine"] if parts else {}
    lines += ["| | |", "| --- | --- |"] + [f"| {key} | {cell(value)} |" for key, value in facts.items()] + [""]
    outputs = []
    for part in parts:
        where = part["machine"].get("GPU", "no GPU")  # the device tool may lend another kind for a later part
        lines += [f"## Part {part['part']}: {PARTS[part['part']][0]} ({where})", ""]
        columns = COLUMNS.get(part["part"])
        named = columns or ["figures"]
        lines += [f"| check | status | s | {' | '.join(named)} | note |", "|" + " --- |" * (len(named) + 4)]
        for check in part["checks"]:
            if columns:
                cells = [shown(check["figures"].get(key, "")) for key in columns]
            else:
                cells = [" · ".join(f"{key} {shown(value)}" for key, value in check["figures"].items())]
            lines.append(f"| {check['name']} | {check['status']} | {check['seconds']:.0f} | "
                         f"{' | '.join(cell(c) for c in cells)} | {cell(check['note'])} |")  # fmt: skip
            if check["output"]:
                outputs.append((check["name"], check["command"], check["output"]))
        lines.append("")
    lines += anchors(parts)
    if outputs:
        lines += ["## Outputs", ""]
        for name, command, output in outputs:
            lines += [f"### {name}", "", f"`{command}`" if command else "", "", "```text", output.strip(), "```", ""]
    return "\n".join(lines)


def anchors(parts: list[dict]) -> list[str]:
    """resnet50's images/s against the published single-GPU figures, alone and in the project, and
    what bounds the project on photos: the loader's best rate on JPEGs against the model's."""
    figures = {check["name"]: check["figures"] for part in parts if part["part"] == 4 for check in part["checks"]}
    alone = next((f.get("images/s") for name, f in figures.items() if name.startswith("resnet50 alone")), None)
    project = next((f.get("images/s") for name, f in figures.items() if "train resnet50" in name), None)
    if not alone:
        return []
    gpu = next(part["machine"].get("GPU", "the CPU") for part in parts if part["part"] == 4)
    lines = [f"## resnet50 on {gpu} against published A100 figures", "",
             "| anchor | images/s | model alone | project's fit |", "| --- | --- | --- | --- |"]  # fmt: skip
    for name, figure in ANCHORS.items():
        in_project = f"{project / figure:.0%}" if project else ""
        lines.append(f"| {name} | {figure} | {alone / figure:.0%} | {in_project} |")
    loader = next((f for name, f in figures.items() if name.startswith("benchmark data")), {})
    if loader:
        workers, best = max(loader.items(), key=lambda item: item[1])
        trains, who = (project, "the project trains") if project else (alone, "the model alone trains")
        bound = "the data loader" if best < trains else "the model"
        lines += ["", f"On JPEG photos the loader gives at best {best} images/s ({workers}), against {trains:.0f} "
                  f"images/s {who} resnet50 at: {bound} bounds training there."]  # fmt: skip
    return [*lines, ""]


def cell(value) -> str:
    """A value as one markdown table cell."""
    return str(value).replace("|", "/").replace("\n", " ")


def shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["all"], help="1 2 3 4, or all (%(default)s)")
    parser.add_argument(
        "--dry-run", action="store_true", help="on the CPU at toy sizes, most training runs only parsed"
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-validation")),
                        help="where the parts' results and the report go ($OUT, else %(default)s)")  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gpu-validation",
                        help="the rendered projects, data and results, kept between parts (%(default)s)")  # fmt: skip
    parser.add_argument("--wheels", type=Path, default=gpu_wheels.WHEELS, help="the carried wheels (%(default)s)")
    parser.add_argument("--report", type=Path, nargs="+", help="merge these part<N>.json files into one report")
    parser.add_argument("--output", type=Path, help="with --report: the markdown file (default: print it)")
    options = parser.parse_args()
    if options.report:
        text = report([json.loads(path.read_text()) for path in options.report])
        if options.output:
            options.output.write_text(text)
        else:
            print(text)
        return 0
    parts = list(PARTS) if options.part == ["all"] else sorted(int(part) for part in options.part)
    validation = Validation(Settings.for_run(options.dry_run), options.work.resolve(), options.out.resolve(),
                            options.wheels.resolve())  # fmt: skip
    validation.work.mkdir(parents=True, exist_ok=True)
    for part in parts:
        validation.start(part)
        for step in PARTS[part][1]:
            getattr(validation, step)()
        for check in (check for check in validation.checks if check.part == part):
            print(f"[part {part}] {check.name}: {check.status} ({check.seconds:.0f} s) {check.note}")
            if check.status == "failed":
                print(tail(check.output, 40))
    found = {path.name: path for folder in (validation.work, validation.out) for path in folder.glob("part*.json")}
    (validation.out / "gpu-validation.md").write_text(report([json.loads(path.read_text()) for path in found.values()]))
    print(f"Report: {validation.out / 'gpu-validation.md'}")
    return 1 if any(c.status == "failed" for c in validation.checks) else 0


if __name__ == "__main__":
    sys.exit(main())
