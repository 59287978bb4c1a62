"""`python -m {{ cookiecutter.package_name }} report [RUN]`: a run's logged metrics as PNG curves.

RUN is a run folder (default: the newest training run under runs/) holding the metrics of a CSV
or W&B logger (metrics.csv) or of a TensorBoard logger (event files). The curves (loss, accuracy,
learning rate) go to RUN/reports/curves.png.
"""

import csv
from pathlib import Path

import matplotlib.pyplot as plt

from ..cli import configured_runs
from ..errors import PACKAGE, CommandParser, DataError, MissingError
from ..training.run_folders import newest_run

PANELS = {
    "loss": ("train/loss_step", "train/loss_epoch", "val/loss"),
    "accuracy": ("train/acc", "val/acc"),
    "learning rate": ("lr-",),  # LearningRateMonitor's names start with it
}


def read_series(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Each logged metric as (step, value) pairs."""
    series: dict[str, list[tuple[int, float]]] = {}
    events = sorted(run.glob("events.out.tfevents.*"))
    if not (run / "metrics.csv").is_file() and not events:
        raise MissingError(
            f"No metrics.csv or TensorBoard events in {run}: point report at a run folder of this project's "
            "loggers (runs/<project>/<run>), or train one."
        )
    metrics = run / "metrics.csv"
    if metrics.is_file():
        with metrics.open(newline="") as file:
            rows = csv.DictReader(file)
            try:
                for row in rows:
                    for name, value in row.items():
                        if name not in ("step", "epoch") and value:
                            series.setdefault(name, []).append((int(row["step"]), float(value)))
            except (KeyError, TypeError, ValueError) as error:
                raise DataError(
                    f"{metrics}, line {rows.line_num}, is not a row of logged numbers ({error!r}): mend or delete "
                    "that line (the CSV and W&B loggers write a step column and numbers)."
                ) from error
        return series
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as error:
        raise MissingError(f"{run} holds TensorBoard event files, which need: pip install tensorboard") from error

    for file in events:
        accumulator = EventAccumulator(str(file)).Reload()
        for name in accumulator.Tags()["scalars"]:
            series.setdefault(name, []).extend((event.step, event.value) for event in accumulator.Scalars(name))
    return series


def plot_curves(series: dict[str, list[tuple[int, float]]], output: Path) -> list[str]:
    """Draw the panels that have data; return the metrics drawn."""
    drawn_panels = {
        title: [name for name in sorted(series) if name.startswith(prefixes)] for title, prefixes in PANELS.items()
    }
    drawn_panels = {title: names for title, names in drawn_panels.items() if names}
    rates = drawn_panels.get("learning rate", [])
    if len(rates) > 1 and all(series[name] == series[rates[0]] for name in rates):
        drawn_panels["learning rate"] = rates[:1]  # parameter groups on one schedule: one line, not several
    if not drawn_panels:
        raise DataError(f"None of the metrics {', '.join(sorted(series)) or '(none)'} is a loss, accuracy or rate.")
    figure, axes = plt.subplots(1, len(drawn_panels), figsize=(5 * len(drawn_panels), 4), squeeze=False)
    for axis, (title, names) in zip(axes[0], drawn_panels.items(), strict=True):
        for name in names:
            steps, values = zip(*sorted(series[name]), strict=True)
            axis.plot(steps, values, label=name, marker="o" if len(steps) < 30 else None)
        axis.set(title=title, xlabel="step")
        axis.legend()
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return [name for names in drawn_panels.values() for name in names]


def the_run_in(folder: Path) -> Path:
    """`folder`, or the one run folder under it (<folder>/<project>/<run>, as a logger lays it out)."""
    if not folder.is_dir():
        raise MissingError(f"{folder} is not a folder: give a run folder (runs/<project>/<run>).")
    logs = {path.parent for pattern in ("metrics.csv", "events.out.tfevents.*") for path in folder.rglob(pattern)}
    if folder in logs or not logs:
        return folder
    if len(logs) > 1:
        raise MissingError(f"{folder} holds {len(logs)} runs: give one of them, such as {min(logs)}.")
    return logs.pop()


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} report", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, nargs="?", help="a run folder, or one holding one run (default: the newest)")
    parser.add_argument("--runs", type=Path, help="where the runs are (default: where fit puts them)")
    options = parser.parse_args(args)
    run = the_run_in(options.run) if options.run else newest_run(options.runs or configured_runs())
    output = run / "reports" / "curves.png"
    drawn = plot_curves(read_series(run), output)
    print(f"Wrote {output}: {', '.join(drawn)}")
    return 0
