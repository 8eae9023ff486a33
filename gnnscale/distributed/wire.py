"""How float32 rows cross the wire: a codec for the rows a :class:`DistTable` sends to other ranks.

``encode(rows, dtype)`` turns float32 ``[k, d]`` rows into one payload tensor that a single
``all_to_all_single`` carries (any of gloo's types), ``decode(payload, dtype, d)`` turns it back
into float32 rows on arrival.  Per element, with ``x`` the sent value and ``x'`` the decoded one
(:func:`error_bound` gives these bounds element by element):

=========== ================ ===============================================================
dtype        bytes per row    ``|x' - x|``
=========== ================ ===============================================================
float32      ``4 d``          0 (the rows themselves; nothing is encoded)
float16      ``2 d``          ``<= 2^-11 |x|`` for ``2^-14 <= |x| <= 65504`` (float16's normal
                              range); ``<= 2^-25`` below it (underflow to float16's subnormals or
                              zero).  Beyond 65504 the value is clamped to +-65504 (float16's
                              largest finite value, never inf): the error is ``|x| - 65504``
bfloat16     ``2 d``          ``<= 2^-8 |x|`` over float32's whole finite range (values above
                              bfloat16's largest finite value are clamped to it, within that
                              bound); ``<= 2^-134`` for ``|x| < 2^-126``
int8         ``d + 4``        ``<= scale / 2 = max|row| / 254``, plus float32 rounding of at most
                              ``scale * 2^-16 + 2^-140``.  Per row ``scale = max|row| / 127``,
                              ``q = round(x / scale)`` in ``[-127, 127]``; a zero row has scale 0
                              and decodes to exact zeros
=========== ================ ===============================================================

The int8 payload is uint8 ``[k, d + 4]``: the ``d`` int8 values, then the row's float32 scale as
its 4 bytes (in the machine's byte order: every rank of a job is assumed to share it).

Non-finite values (NaN, +-inf) have no bound in any of the lossy codes (int8 would lose the
whole row), so :func:`encode` refuses them with ``ValueError`` naming the first such row; float32
sends them as they are.  The features a trainer loads are checked finite on loading; a non-finite
embedding during evaluation means that training diverged.
"""

from __future__ import annotations

import torch
from torch import Tensor

WIRE_DTYPES = ("float32", "float16", "bfloat16", "int8")
"""The names :func:`encode` accepts, lossless first."""

FLOAT16_MAX = float(torch.finfo(torch.float16).max)  # 65504
INT8_LEVELS = 127  # symmetric: -127..127, so that -max|row| and +max|row| both encode exactly
_SCALE_BYTES = 4  # one float32 per int8 row

# Per-element bounds of the float codes, ``(relative, absolute floor)``: half a unit in the last
# place of a normal value (11 and 8 significant bits), half the subnormal spacing below that.
_FLOAT_BOUNDS = {"float16": (2.0**-11, 2.0**-25), "bfloat16": (2.0**-8, 2.0**-134)}
_CAST = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def check_wire_dtype(dtype: str) -> str:
    """``dtype`` itself when it is one of :data:`WIRE_DTYPES`.

    Raises:
        ValueError: any other value, naming it and the valid ones.
    """
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"--wire-dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")
    return dtype


def row_bytes(dtype: str, d: int) -> int:
    """Bytes one row of ``d`` values takes on the wire: ``4d``, ``2d``, ``2d`` or ``d + 4``."""
    check_wire_dtype(dtype)
    if dtype == "int8":
        return d + _SCALE_BYTES
    return d * (4 if dtype == "float32" else 2)


def empty_payload(k: int, dtype: str, d: int) -> Tensor:
    """An uninitialised buffer for ``k`` encoded rows of ``d`` values (what :func:`encode` returns)."""
    check_wire_dtype(dtype)
    if dtype == "int8":
        return torch.empty((k, d + _SCALE_BYTES), dtype=torch.uint8)
    return torch.empty((k, d), dtype=_CAST.get(dtype, torch.float32))


def encode(rows: Tensor, dtype: str) -> Tensor:
    """The payload of float32 ``rows`` [k, d] in wire dtype ``dtype`` (see the module docstring).

    Returns:
        float32 [k, d] (``rows`` itself), float16/bfloat16 [k, d], or uint8 [k, d + 4] for int8.

    Raises:
        ValueError: ``dtype`` is unknown, or a lossy ``dtype`` meets a NaN or infinite value.
        TypeError: ``rows`` is not a float32 matrix.
    """
    check_wire_dtype(dtype)
    if rows.dtype != torch.float32 or rows.dim() != 2:
        raise TypeError(f"wire encoding takes float32 [k, d] rows, got {rows.dtype} of shape {list(rows.shape)}")
    if dtype == "float32":
        return rows
    if dtype == "int8":
        return _encode_int8(rows)
    if not bool(torch.isfinite(rows).all()):
        _refuse_non_finite(rows, dtype)
    # nan_to_num turns only the overflow of finite values (inputs are finite) into the largest finite value.
    return torch.nan_to_num(rows.to(_CAST[dtype]))


def decode(payload: Tensor, dtype: str, d: int, out: Tensor | None = None) -> Tensor:
    """float32 [k, d] rows from a payload of :func:`encode` (into ``out``, float32 [k, d], when given)."""
    check_wire_dtype(dtype)
    width = d + _SCALE_BYTES if dtype == "int8" else d
    assert payload.dim() == 2 and payload.shape[1] == width, (list(payload.shape), dtype, d)
    if out is None:
        out = torch.empty((payload.shape[0], d), dtype=torch.float32)
    if dtype != "int8":
        return out.copy_(payload)
    quantised = payload[:, :d].view(torch.int8)
    # The scale's 4 bytes start at an offset that need not be a multiple of 4: copied to fresh storage before
    # the view (contiguous() would not copy a single row's slice, which is contiguous already).
    scale = torch.empty((payload.shape[0], _SCALE_BYTES), dtype=torch.uint8).copy_(payload[:, d:]).view(torch.float32)
    return torch.mul(quantised, scale, out=out)


def to_bytes(rows: Tensor, dtype: str) -> Tensor:
    """uint8 [k, b]: the payload of ``rows`` [k, d] as bytes, so that rows of several kinds (exact times
    beside encoded values) share one buffer of one collective.  ``float32`` sends the rows' own bytes,
    whatever their float dtype (float64 too), exactly; the lossy codes take float32 rows (:func:`encode`)."""
    payload = rows if dtype == "float32" else encode(rows, dtype)
    return payload.contiguous().view(torch.uint8)  # [k, d * element size]


def from_bytes(payload: Tensor, dtype: str, d: int, like: torch.dtype = torch.float32) -> Tensor:
    """The [k, d] rows of a :func:`to_bytes` payload (its columns may be a slice of a wider buffer):
    ``float32`` gives them back in their own dtype ``like``, the lossy codes decode to float32."""
    if dtype == "float32":
        return bytes_as(payload, like)
    return decode(payload if dtype == "int8" else bytes_as(payload, _CAST[dtype]), dtype, d)


def bytes_as(payload: Tensor, dtype: torch.dtype) -> Tensor:
    """uint8 [k, b] columns (any slice) as [k, b / size] values of ``dtype``, through fresh storage: a
    slice starts at an offset that need not be a multiple of the size, and ``contiguous()`` would not
    copy one that is contiguous already (a single row, or none)."""
    return torch.empty(payload.shape, dtype=torch.uint8).copy_(payload).view(dtype)


def byte_width(dtype: str, d: int, like: torch.dtype = torch.float32) -> int:
    """Bytes of one :func:`to_bytes` row: :func:`row_bytes`, or ``d`` values of ``like`` for ``float32``."""
    if dtype == "float32":
        return d * torch.finfo(like).bits // 8
    return row_bytes(dtype, d)


def error_bound(dtype: str, rows: Tensor) -> Tensor:
    """float64, ``rows``' shape: the bound on ``|decode(encode(rows)) - rows|`` of each element.

    Args:
        dtype: the wire dtype.
        rows: float32 [k, d], finite.
    """
    check_wire_dtype(dtype)
    magnitude = rows.abs().double()
    if dtype == "float32":
        return torch.zeros_like(magnitude)
    if dtype == "int8":
        scale = _int8_scale(rows).double().unsqueeze(1)
        return (scale * (0.5 + 2.0**-16) + 2.0**-140).expand_as(magnitude).clone()
    relative, floor = _FLOAT_BOUNDS[dtype]
    bound = (magnitude * relative).clamp_(min=floor)
    if dtype == "float16":
        bound = torch.where(magnitude > FLOAT16_MAX, magnitude - FLOAT16_MAX, bound)
    return bound


def _int8_scale(rows: Tensor) -> Tensor:
    """float32 [k]: ``max|row| / 127`` (0 for a zero row), exactly the scale :func:`encode` sends."""
    if rows.shape[1] == 0:
        return rows.new_zeros(rows.shape[0])
    return rows.abs().amax(dim=1) / INT8_LEVELS


def _encode_int8(rows: Tensor) -> Tensor:
    """uint8 [k, d + 4]: per row the int8 codes, then the float32 scale's bytes."""
    k, d = rows.shape
    scale = _int8_scale(rows)
    if not bool(torch.isfinite(scale).all()):  # max|row| carries a NaN or inf of its row
        _refuse_non_finite(rows, "int8")
    # A zero row (or one so tiny that its scale underflows to 0) divides by 1: its codes are 0.
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    levels = (rows / divisor.unsqueeze(1)).round_().clamp_(-INT8_LEVELS, INT8_LEVELS)
    payload = torch.empty((k, d + _SCALE_BYTES), dtype=torch.uint8)
    payload[:, :d].view(torch.int8).copy_(levels)  # integral values: the conversion is exact
    payload[:, d:] = scale.unsqueeze(1).view(torch.uint8)
    return payload


def _refuse_non_finite(rows: Tensor, dtype: str) -> None:
    """Raise the ``ValueError`` of :func:`encode` for rows holding a NaN or an infinite value."""
    bad = ~torch.isfinite(rows)
    row = int(torch.nonzero(bad.any(dim=1))[0, 0])
    value = float(rows[row][bad[row]][0])
    raise ValueError(f"wire dtype {dtype} cannot send non-finite values: row {row} of the {rows.shape[0]} being "
                     f"sent holds {value} ({int(bad.sum())} non-finite value(s) in all); only float32 "
                     f"sends them as they are (--wire-dtype float32); non-finite embeddings in evaluation mean "
                     f"that training diverged (lower --lr)")
