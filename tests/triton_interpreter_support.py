"""Run Triton kernels on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1), for CI without a GPU.

Import this module before the kernels. With KERNEL_TEST_DEVICE=cuda it only selects the GPU (kernels
compiled as in production). Otherwise it sets the env, reloads kernel modules that were already imported
without it (`kernel_module`), and works around two bugs of
the interpreter in triton 3.6 with numpy 2.4: loop bounds loaded from memory are 1-element arrays that
`range()` cannot take (`int()` of an array with ndim > 0 is an error since numpy 2.4), and bfloat16 (held
as uint16 bit patterns) is only handled in casts from and to fp32: `tl.dot` on bf16 multiplies the bit
patterns and an int8 -> bf16 cast reinterprets the integer. The shims widen bf16 to fp32 for tl.dot and
route other casts from and to bf16 through fp32. It also makes the interpreter refuse tl.dot shapes that
the NVIDIA backend refuses (K >= 16, 32 for 8-bit), which the interpreter itself allows. They touch the interpreter only (the kernels keep bf16
arithmetic out of elementwise code; fp32 -> bf16 stays the interpreter's own, truncating, cast).
"""

import importlib
import os
from types import ModuleType

DEVICE = "cuda" if os.environ.get("KERNEL_TEST_DEVICE") == "cuda" else "cpu"
INTERPRET = DEVICE == "cpu"
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")

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
    """Import a kernel module; reloaded if its kernels were compiled for a GPU before the env was set."""
    module = importlib.import_module(name)
    compiled = any(isinstance(value, triton.runtime.jit.JITFunction) for value in vars(module).values())
    if INTERPRET and compiled:
        module = importlib.reload(module)
    return module


if INTERPRET:
    interpreter._patch_lang_tensor = _patched_lang_tensor
    interpreter.InterpreterBuilder.create_dot = _create_dot_bf16
    interpreter.InterpreterBuilder.cast_impl = _cast_through_fp32
    interpreter.InterpreterBuilder.__init__ = _builder_with_min_dot_size
