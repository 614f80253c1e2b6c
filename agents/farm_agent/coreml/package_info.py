"""What a saved .mlpackage says about itself, read back from its spec (runs on any OS: no Core ML runtime needed).

This is what the tests check and what `farm ane convert` prints: the functions (one per batch bucket), their input
and output names, static shapes and dtypes, the compute precision the ops run at, the compute units Farm loads it
with, and the ops by type.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# Metadata keys Farm writes into the package. Compute units are a load-time choice in Core ML, not part of the
# model, so the converter records the one the model was converted and checked for and the ANE backend loads with it.
META_COMPUTE_UNITS = "farm.compute_units"
META_MODEL_HASH = "farm.model_hash"
META_BUCKETS = "farm.batch_buckets"
META_SOURCE = "farm.source"  # how the PyTorch model was captured (convert.CAPTURES)
META_REWRITES = "farm.rewrites"  # JSON list: what static.py rewrote for the Neural Engine, and why

FUNCTION_PREFIX = "batch_"


def quiet_coremltools() -> None:
    """coremltools warns on import about what Linux lacks (the Core ML runtime) and about untested torch and
    scikit-learn versions; Farm says what matters itself."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "int32", "float16"


@dataclass(frozen=True)
class FunctionInfo:
    name: str  # batch_<bucket>
    bucket: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_counts: dict[str, int] = field(default_factory=dict)  # op type -> count, in this function
    compute_dtypes: tuple[str, ...] = ()  # the float dtypes computed ops produce: ("float16",) for fp16 precision
    op_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (op type, its first output's shape), computed ops only


@dataclass(frozen=True)
class PackageInfo:
    path: Path
    spec_version: int
    default_function: str
    functions: tuple[FunctionInfo, ...]
    metadata: dict[str, str]

    @property
    def compute_units(self) -> str:
        return self.metadata.get(META_COMPUTE_UNITS, "")

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(f.bucket for f in self.functions)

    @property
    def precision(self) -> str:
        """"float16" when every computed op produces fp16; otherwise the dtypes found, joined."""
        dtypes = sorted({d for f in self.functions for d in f.compute_dtypes})
        return "+".join(dtypes) or "none"

    def function(self, bucket: int) -> FunctionInfo:
        return next(f for f in self.functions if f.bucket == bucket)


# Ops that move data in and out of the model's compute precision or hold constants: not "computed".
_NOT_COMPUTED = {"const", "cast"}


def _dtype_name(enum_name: str) -> str:
    return enum_name.lower()  # MIL's "FLOAT16" -> "float16"


def _tensor(name: str, multi_array: object) -> TensorInfo:
    from coremltools.proto import FeatureTypes_pb2

    kind = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(multi_array.dataType)  # type: ignore[attr-defined]
    return TensorInfo(name, tuple(int(d) for d in multi_array.shape), _dtype_name(kind))  # type: ignore[attr-defined]


def read_package(path: Path) -> PackageInfo:
    quiet_coremltools()
    import coremltools as ct
    from coremltools.proto import MIL_pb2

    spec = ct.utils.load_spec(str(path))
    descriptions = {f.name: f for f in spec.description.functions}
    functions = []
    for name, function in spec.mlProgram.functions.items():
        block = function.block_specializations[function.opset]
        counts = Counter(op.type for op in block.operations)
        dtypes = {
            _dtype_name(MIL_pb2.DataType.Name(out.type.tensorType.dataType))
            for op in block.operations if op.type not in _NOT_COMPUTED
            for out in op.outputs if out.type.WhichOneof("type") == "tensorType"
        }
        shapes = tuple(
            (op.type, tuple(int(d.constant.size) for d in op.outputs[0].type.tensorType.dimensions))
            for op in block.operations
            if op.type not in _NOT_COMPUTED and op.outputs and op.outputs[0].type.WhichOneof("type") == "tensorType"
        )
        described = descriptions[name]
        functions.append(FunctionInfo(
            name=name, bucket=int(name.removeprefix(FUNCTION_PREFIX)),
            inputs=tuple(_tensor(i.name, i.type.multiArrayType) for i in described.input),
            outputs=tuple(_tensor(o.name, o.type.multiArrayType) for o in described.output),
            op_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            compute_dtypes=tuple(sorted(d for d in dtypes if d.startswith("float"))), op_shapes=shapes,
        ))
    functions.sort(key=lambda f: f.bucket)
    return PackageInfo(
        path=path, spec_version=spec.specificationVersion, default_function=spec.description.defaultFunctionName,
        functions=tuple(functions), metadata=dict(spec.description.metadata.userDefined),
    )
