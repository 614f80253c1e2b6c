"""`farm ane convert SPEC --out X.mlpackage`: a job's model as a Core ML ML Program for the Neural Engine, and what
the conversion tells about it (ops, precision, compute units, shapes and dtypes per batch bucket, Neural-Engine
notes). Conversion runs on any OS with coremltools (the `apple` extra); running the package needs a Mac."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from farm.cli.options import Json
from farm.cli.render import console, print_json
from farm.client.preflight import read_spec
from farm.core.errors import UserError
from farm.core.spec import ModelJobSpec

if TYPE_CHECKING:
    from farm_agent.coreml.convert import Conversion

app = typer.Typer(help="The Apple Neural Engine: Core ML conversion of a job's model.", no_args_is_help=True)

EXAMPLE_ITEMS = 8  # dataset items the model is traced with


def parse_buckets(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"--buckets {text!r}: expected comma-separated batch sizes, e.g. 1,8,32,64") from None
    if not sizes or min(sizes) < 1:
        raise UserError(f"--buckets {text!r}: batch sizes must be positive")
    return tuple(sorted(set(sizes)))


@app.command()
def convert(
    spec: Annotated[Path, typer.Argument(help="A job spec (YAML): its model, weights and dataset are converted.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the package (X.mlpackage).")],
    buckets: Annotated[str, typer.Option(help="Batch sizes the package has static shapes for.")] = "1,8,32,64",
    workdir: Annotated[Path, typer.Option(help="The folder the spec's model and dataset import from.")] = Path("."),
    json: Json = False,
) -> None:
    """Convert a job's model to Core ML (fp16, CPU_AND_NE, one static function per batch bucket) and describe it."""
    if out.suffix != ".mlpackage":
        raise UserError(f"--out {out}: the package's name must end in .mlpackage")
    sizes = parse_buckets(buckets)
    _, job = read_spec(spec, workdir)
    if not isinstance(job, ModelJobSpec):
        raise UserError(f"{spec}: a {job.kind.value} job has no model to convert")
    try:
        from farm_agent.coreml.convert import ConversionError
        from farm_agent.coreml.convert import convert as convert_model
    except ImportError as exc:
        raise UserError(f"coremltools is not installed ({exc}): pip install 'farm[apple]'") from None
    from farm_agent.work.jobcode import build_model, load_dataset

    root = workdir.resolve()
    inputs, _ = load_dataset(job.dataset, root)
    module = build_model(job.model, job.weights, root)
    try:
        conversion = convert_model(module, inputs[:EXAMPLE_ITEMS], out, sizes)
    except ConversionError as exc:
        raise UserError(f"model {job.model!r} does not convert to Core ML: {exc}") from None
    if json:
        print_json(conversion_json(job.model, conversion))
    else:
        show(job.model, conversion)


def conversion_json(model: str, conversion: Conversion) -> dict[str, Any]:
    package = conversion.package
    return {
        "model": model,
        "package": str(package.path),
        "seconds": round(conversion.seconds, 2),
        "source": conversion.source,
        "precision": package.precision,
        "compute_units": package.compute_units,
        "buckets": list(package.buckets),
        "default_function": package.default_function,
        "functions": [
            {
                "name": f.name, "bucket": f.bucket,
                "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in f.inputs],
                "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in f.outputs],
                "ops": f.op_counts,
            }
            for f in package.functions
        ],
        "ane_notes": list(conversion.notes),
    }


def show(model: str, conversion: Conversion) -> None:
    package = conversion.package
    console.print(f"[bold]{model}[/] -> {package.path}  ({conversion.seconds:.1f} s, captured with "
                  f"{conversion.source})", highlight=False)
    console.print(f"precision {package.precision}, compute units {package.compute_units}, batch buckets "
                  f"{', '.join(map(str, package.buckets))} (a batch is padded up to its bucket)", highlight=False)
    shapes = Table(title="Functions", title_justify="left")
    for column in ("FUNCTION", "INPUTS", "OUTPUTS"):
        shapes.add_column(column)
    for f in package.functions:
        shapes.add_row(f.name, *(", ".join(f"{t.name} {list(t.shape)} {t.dtype}" for t in tensors)
                                 for tensors in (f.inputs, f.outputs)))
    console.print(shapes)
    default = package.function(package.buckets[-1])
    ops = Table(title=f"Ops ({default.name})", title_justify="left")
    ops.add_column("OP")
    ops.add_column("COUNT", justify="right")
    for op, count in default.op_counts.items():
        ops.add_row(op, str(count))
    console.print(ops)
    console.print("[bold]Neural Engine notes[/]")
    for note in conversion.notes or ("no known obstacles",):
        console.print(f"- {note}", highlight=False)
    console.print("- which ops really run on the Neural Engine is Core ML's choice on the Mac (MLComputePlan)",
                  highlight=False)
