"""Run Triton kernels on CPU tensors through Triton's interpreter, for CI without a GPU.

Without a GPU (or with KERNEL_TEST_DEVICE=cpu) importing this module sets TRITON_INTERPRET=1 for the
process before triton is imported (triton's own jit helpers such as tl.cdiv are decorated then), and
`kernel_module(name)` imports a kernel module interpreted (reloading it if it was compiled earlier). With
a GPU (or KERNEL_TEST_DEVICE=cuda) nothing is interpreted: DEVICE is "cuda" and kernels compile as in
production, so a full test run on a GPU machine is not turned into interpreter runs.

Shims for the interpreter of triton 3.6 with numpy 2.4 (they touch the interpreter only):
- loop bounds loaded from memory are 1-element arrays that `range()` cannot take (`int()` of an array
  with ndim > 0 is an error since numpy 2.4);
- bfloat16, held as uint16 bit patterns, is only handled in casts from and to fp32: `tl.dot` on bf16
  multiplies the bit patterns and an int8 -> bf16 cast reinterprets the integer. bf16 is widened to fp32
  for tl.dot and other casts from and to bf16 go through fp32 (the kernels keep bf16 out of elementwise
  arithmetic; fp32 -> bf16 stays the interpreter's own, truncating, cast);
- the interpreter allows any tl.dot shape; it now refuses those the NVIDIA backend refuses (K >= 16,
  32 for 8-bit operands), so a tile the GPU compiler would reject fails here too.
"""

import importlib
import os
import sys
from types import ModuleType

import torch

_FORCED = os.environ.get("KERNEL_TEST_DEVICE")
DEVICE = _FORCED or ("cuda" if torch.cuda.is_available() else "cpu")
INTERPRET = DEVICE == "cpu"
_TRITON_WAS_IMPORTED = "triton" in sys.modules
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")
if INTERPRET and _TRITON_WAS_IMPORTED and isinstance(tl.zeros, triton.runtime.jit.JITFunction):
    # another test imported triton before the flag was set: re-define triton's own jit helpers
    # (tl.zeros, tl.cdiv, the reduction combiners, ...) interpreted, and rebind them in triton.language
    importlib.reload(importlib.import_module("triton.language.standard"))
    tl = importlib.reload(tl)

_patch_lang_tensor = interpreter._patch_lang_tensor


def _patched_lang_tensor(tensor: object, scope: object) -> None:
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


def _as_fp32(handle: object) -> object:
    if handle.dtype.scalar != tl.bfloat16:
        return handle
    widened = (handle.data.astype(np.uint32) << 16).view(np.float32)
    return interpreter.TensorHandle(widened, tl.float32)


_create_dot = interpreter.InterpreterBuilder.create_dot


def _create_dot_bf16(
    self: object, a: object, b: object, d: object, precision: object, imprecise: int
) -> object:
    return _create_dot(self, _as_fp32(a), _as_fp32(b), d, precision, imprecise)


_cast_impl = interpreter.InterpreterBuilder.cast_impl


def _cast_through_fp32(self: object, src: object, dst_type: object) -> object:
    types = (src.dtype.scalar, dst_type.scalar)
    if tl.bfloat16 in types and tl.float32 not in types and types[0] != types[1]:
        src = _cast_impl(self, src, tl.float32)
    return _cast_impl(self, src, dst_type)


_builder_init = interpreter.InterpreterBuilder.__init__


def _nvidia_min_dot_size(lhs_type: object, rhs_type: object) -> tuple[int, int, int]:
    return (1, 1, 32) if lhs_type.scalar.primitive_bitwidth == 8 else (1, 1, 16)


def _builder_with_min_dot_size(self: object) -> None:
    _builder_init(self)
    self.codegen_fns["min_dot_size"] = _nvidia_min_dot_size


def kernel_module(name: str) -> ModuleType:
    """Import a kernel module, interpreted on CPU (reloaded if its kernels were first compiled for a GPU)."""
    module = importlib.import_module(name)
    if INTERPRET and any(
        isinstance(value, triton.runtime.jit.JITFunction) for value in vars(module).values()
    ):
        module = importlib.reload(module)
    return module


if INTERPRET:
    interpreter._patch_lang_tensor = _patched_lang_tensor
    interpreter.InterpreterBuilder.create_dot = _create_dot_bf16
    interpreter.InterpreterBuilder.cast_impl = _cast_through_fp32
    interpreter.InterpreterBuilder.__init__ = _builder_with_min_dot_size
