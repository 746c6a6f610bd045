"""The pattern every op follows: what an op is (its tensor arguments, its options, its output), its
one DPS call path and its allocating form. ``decode.py`` and ``prefill.py`` are its two instances;
the framework entry points (``torch_ops``, ``jax_ops``, ``tvm_relax``) are built from the same
descriptions, so a third op is one more description and its native functions.

On every layer an op is one DPS function: its tensor inputs, then the output it writes, then its
scalar attributes (``sorted``, ``positions``, ``max_seq_len``, ``absolute_ids``): the native export of
that name in each module (cuda/csrc/cpu_binding.cc, cuda/csrc/cuda_binding.cc), the XLA FFI target,
the TVM global.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import _arrays, _ffi_api
from .contract import MAX_TOPK


@dataclass(frozen=True)
class Option:
    """A keyword option of an op and the native attribute it becomes."""

    name: str                      # as the caller writes it: "sorted", "ids", "max_seq_len"
    default: Any                   # a bool, a str, or None (an optional int)
    # every value it takes (a TVM global is registered for each); None: any int, a run-time value
    # (a TVM program passes it as an argument)
    choices: tuple | None
    attr: str                      # the native attribute (a bool or an int64): "sorted", "positions"
    to_attr: Callable[[Any], bool | int]  # value -> attribute, or ValueError naming the option

    @property
    def torch_type(self) -> str:
        if isinstance(self.default, bool):
            return "bool"
        # an optional int: SymInt, so that torch.compile traces it symbolically (int would be
        # specialized: a recompile for every value)
        return "str" if isinstance(self.default, str) else "SymInt?"


def bool_attr(option: str) -> Callable[[Any], bool]:
    """`to_attr` of a bool option: the value itself when it is a bool (or a numpy bool), else a
    TypeError naming the option (_arrays._strict_bool)."""
    return functools.partial(_arrays._strict_bool, option)


def choice_attr(option: str, choices: tuple, meaning: tuple):
    """`to_attr` of a two-valued str option whose native attribute is a bool: `choices[0]` (the
    default) is False, `choices[1]` True; any other value is a ValueError naming the option and
    saying what each value means (`meaning`, one phrase per choice)."""
    off, on = choices
    expected = " or ".join(f"{c!r} ({m})" for c, m in zip(choices, meaning))

    def to_attr(value) -> bool:
        if isinstance(value, str):
            if value == off:
                return False
            if value == on:
                return True
        raise ValueError(f"{option} must be {expected}, got {value!r}")

    return to_attr


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per op
class Op:
    """One op, as every layer sees it."""

    name: str                       # the native export, the torch op, the TVM global, the XLA target's suffix
    params: tuple[str, ...]         # the tensor arguments' parameter names, the output last
    arg_names: tuple[str, ...]      # how messages name them: the C++ check's k*ArgNames, the same strings
    fp8_args: frozenset[int]        # positions that may be float8_e4m3fn (numpy's travel as uint8 bytes)
    row_args: tuple[int, ...]       # positions of the per-row inputs: split over devices, folded under vmap
    length_args: tuple[int, ...]    # the per-row inputs that say how long a row is: zeroed, the row is empty
    options: tuple[Option, ...]
    output_shape: Callable[[tuple, Any], tuple]  # (q's shape, K) -> the output an allocating caller makes
    validate: Callable[..., None]   # (inputs...) -> None: the host checks behind validate=True
    # (inputs' shapes) -> (query rows, table pages): what sizes a CUDA call's scratch; None: it takes none
    workspace_rows: Callable[[tuple], tuple[int, int]] | None = None
    # the device types a native module serves it on; on another one every entry point raises
    # NotImplementedError before anything is written (an op whose CUDA kernel is still to come)
    devices: tuple[str, ...] = ("cpu", "cuda")
    # the public call behind `validate` ("ffi_dsa.validate_pages(k_cache, seq_lens, block_table)"), which
    # errors name where validate=True cannot run (traced JAX arrays have no values to read)
    validate_with: str = ""

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.params[:-1]

    def attrs(self, options: dict) -> tuple:
        """The native attributes, in order, for `options` (name -> value; a missing one is its default)."""
        return tuple(o.to_attr(options.get(o.name, o.default)) for o in self.options)

    def kernel_for(self, device_type: str):
        """The native DPS function serving tensors of `device_type` ('cpu' or 'cuda'), or
        NotImplementedError when no module has one for this op yet (no CUDA module is loaded or
        built to find that out)."""
        if device_type not in self.devices and device_type in ("cpu", "cuda"):
            raise NotImplementedError(
                f"ffi_dsa.{self.name} has no {device_type.upper()} kernel yet (it runs on "
                f"{' and '.join(d.upper() for d in self.devices)} tensors); nothing was written")
        return _ffi_api.kernel_for(self.name, device_type)


class TopKRangeError(ValueError, IndexError):
    """A `topk` no output can have (negative, or above MAX_TOPK): the contract's ValueError, which
    is also an IndexError because that is the one error torch.compile's fake-tensor pass lets
    through as it is (any other surfaces as a TorchRuntimeError whose first line is dynamo's, with
    this message further down)."""


def checked_topk(topk) -> int:
    """K as an int, or ValueError, shared by every entry point that allocates the output: a
    negative K is no output shape (C++ cannot see it), and a K above MAX_TOPK is refused here,
    naming topk (the C++ check would name the output, which the caller never made)."""
    try:
        topk = operator.index(topk)
    except TypeError:
        if hasattr(topk, "__dlpack__") or isinstance(topk, np.ndarray):
            # the DPS form's output where the allocating form takes K (prefill_topk_indexer was the DPS name once)
            raise TypeError(f"topk must be an int (K, the output's width), got a {type(topk).__name__}: this entry "
                            "point allocates and returns the output; to write into a buffer of your own call the "
                            "DPS form (ffi_dsa.call, ffi_dsa.prefill_call) with it as the last tensor") from None
        raise TypeError(f"topk must be an int, got {topk!r}") from None
    if topk < 0:
        raise TopKRangeError(f"topk must be >= 0, got {topk}")
    if topk > MAX_TOPK:
        raise TopKRangeError(f"topk must be <= {MAX_TOPK} (the kernel supports K <= {MAX_TOPK}), got {topk}")
    return topk


def call(op: Op, args: tuple, attrs: tuple, validate: bool) -> None:
    """The DPS call of `op` on `args` (its inputs, then the output) with native `attrs`: write the
    output in place. Mistakes (dtype, shape, device, no tensor at all) raise TypeError/ValueError
    naming the argument before anything is written; ``validate`` runs the op's host checks too."""
    # The C++ check (and tvm-ffi's conversion) rejects whatever is wrong; which argument is no
    # tensor at all is worked out only then (named_argument_error), off the per-call path.
    validate = _arrays._strict_bool("validate", validate)
    try:
        ready = _arrays.all_dlpack_ready(args, op.arg_names, op.fp8_args)
        kernel = op.kernel_for(_arrays.device_type(args[0]))
        if validate:
            op.validate(*args[:-1])
    except (TypeError, ValueError, AttributeError, RuntimeError, BufferError) as err:
        raise _arrays.named_argument_error(err, args, op.arg_names) from None
    try:
        kernel(*ready, *attrs)
    except (TypeError, ValueError, RuntimeError, BufferError) as err:
        raise _arrays.named_argument_error(err, args, op.arg_names) from None


def allocate_and_call(op: Op, inputs: tuple, topk, options: dict, validate: bool):
    """The allocating form of `op` for arrays that can be written (numpy, torch, CuPy): its int32
    output (``op.output_shape``) in q's framework and on its device, written by :func:`call`. (JAX
    arrays, which are immutable, take ffi_dsa.jax_ops.call instead.)"""
    q = inputs[0]
    attrs = op.attrs(options)  # a bad option fails before anything else
    _arrays.check_tensor(q, op.arg_names[0])
    topk = checked_topk(topk)
    op.kernel_for(_arrays.device_type(q))  # a device without a kernel fails before anything is allocated
    out = _arrays.empty_like_framework(q, op.output_shape(q.shape, topk), "int32")
    call(op, (*inputs, out), attrs, validate)
    return out
