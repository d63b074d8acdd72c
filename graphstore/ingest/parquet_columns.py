"""Turn Arrow columns of a user's Parquet files into the numpy arrays and schemas ingest stores."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphstore.errors import InvalidInputError
from graphstore.ingest.chunks import ColumnSchema
from graphstore.ingest.source import SUPPORTED_DTYPES

# column names that become another attribute name (as the other readers name them)
RENAMES = {"label": "y"}
MASKS = ("train_mask", "val_mask", "test_mask")
_FIX_TYPE = ("store numbers: integers, floats or booleans, or a list/fixed-size list of floats for a feature "
             "matrix (e.g. df['x'] = list(features)); cast or drop the column")


def attr_names(columns: list[str], reserved: tuple[str, ...], where: str) -> dict[str, str]:
    """``{column: attribute}`` for every column but ``reserved``; ``label`` becomes ``y`` (not both)."""
    out = {}
    for column in columns:
        if column in reserved:
            continue
        if column.startswith("__index_level_"):
            raise InvalidInputError(f"{where}: column {column!r} is a pandas index, not a graph column; write the "
                                    "files with df.to_parquet(path, index=False)")
        name = RENAMES.get(column, column)
        if name in out.values():
            raise InvalidInputError(f"{where}: columns {column!r} and {name!r} both name attribute {name!r}; "
                                    "drop or rename one of them")
        if name == "orig_id":
            raise InvalidInputError(f"{where}: column 'orig_id' is reserved for the input IDs; rename it")
        out[column] = name
    return out


def schema_difference(first: Any, other: Any, first_name: str, other_name: str) -> str:
    """How two files' Arrow schemas differ, in one line (``""``: the same columns and types, in any order).

    Examples
    --------
    >>> import pyarrow as pa
    >>> schema_difference(pa.schema([("src", pa.int64()), ("w", pa.float32())]),
    ...                   pa.schema([("src", pa.int32())]), "a.parquet", "b.parquet")
    "'w' only in a.parquet; 'src' is int64 in a.parquet but int32 in b.parquet"
    """
    a, b = {f.name: f.type for f in first}, {f.name: f.type for f in other}
    first_name, other_name = first_name.rsplit("/", 1)[-1], other_name.rsplit("/", 1)[-1]
    out = [f"{', '.join(map(repr, names))} only in {where}"
           for names, where in (([n for n in a if n not in b], first_name), ([n for n in b if n not in a], other_name))
           if names]
    out += [f"{n!r} is {a[n]} in {first_name} but {b[n]} in {other_name}" for n in a if n in b and a[n] != b[n]]
    return "; ".join(out)


def column_schema(arrow_type: Any, name: str, where: str, width: int | None) -> ColumnSchema:
    """The stored dtype and row shape of a column, from its Arrow type (``width`` for variable lists)."""
    import pyarrow as pa

    if is_list_column(arrow_type):
        value_dtype = _numpy_dtype(arrow_type.value_type, name, where)
        if pa.types.is_fixed_size_list(arrow_type):
            width = arrow_type.list_size
        return ColumnSchema(value_dtype.str, (int(width or 0),))
    return ColumnSchema(_numpy_dtype(arrow_type, name, where).str, ())


def is_list_column(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
                or pa.types.is_fixed_size_list(arrow_type))


def _numpy_dtype(arrow_type: Any, name: str, where: str) -> np.dtype:
    import pyarrow as pa

    if not (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)):
        raise InvalidInputError(f"{where}: column {name!r} has type {arrow_type}; {_FIX_TYPE}")
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    if dtype not in SUPPORTED_DTYPES:
        raise InvalidInputError(f"{where}: column {name!r} has type {arrow_type}, which torch cannot hold; "
                                "cast it to int64 (or float32) before writing")
    if name in MASKS and dtype != np.bool_:
        raise InvalidInputError(f"{where}: mask column {name!r} has type {arrow_type}; write it as booleans "
                                "(df[name].astype(bool))")
    return dtype


def list_width(column: Any, name: str, where: str) -> int:
    """The length every row of a variable-size list column has, or an error for ragged rows."""
    lengths = np.asarray(column.value_lengths().to_numpy(zero_copy_only=False))
    if lengths.size and (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise InvalidInputError(
            f"{where}: list column {name!r} is ragged (row 0 has {int(lengths[0])} values, row {row} has "
            f"{int(lengths[row])}); every row of a feature column needs the same length: pad or drop rows"
        )
    return int(lengths[0]) if lengths.size else 0


def to_numpy(column: Any, name: str, schema: ColumnSchema, where: str) -> np.ndarray:
    """One Arrow column (Array or ChunkedArray) as a numpy array of ``schema``; nulls and ragged rows refused."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        row = int(np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False)))[0])
        raise InvalidInputError(f"{where}: column {name!r} has {column.null_count} null value(s), the first in "
                                f"row {row}; fill or drop them before writing (graphstore stores no nulls)")
    if not is_list_column(column.type):
        return np.asarray(column.to_numpy(zero_copy_only=False)).astype(schema.dtype, copy=False)
    width = schema.shape[0]
    if not pa.types.is_fixed_size_list(column.type):
        got = list_width(column, name, where)
        if len(column) and got != width:
            raise InvalidInputError(f"{where}: list column {name!r} has rows of {got} values where the first "
                                    f"row group has {width}; every row needs the same length")
    values = column.flatten()
    if values.null_count:
        raise InvalidInputError(f"{where}: list column {name!r} holds null values inside its lists; fill them "
                                "(e.g. with 0.0) before writing")
    flat = np.asarray(values.to_numpy(zero_copy_only=False)).astype(schema.dtype, copy=False)
    return flat.reshape(len(column), width)
