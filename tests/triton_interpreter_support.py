"""Run Triton kernels on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1), for CI without a GPU.

Import this module before the kernels. With KERNEL_TEST_DEVICE=cuda it only selects the GPU (kernels
compiled as in production). Otherwise it sets the env, reloads kernel modules that were already imported
without it (`kernel_module`), and works around two bugs of
the interpreter in triton 3.6 with numpy 2.4: loop bounds loaded from memory are 1-element arrays that
`range()` cannot take (`int()` of an array with ndim > 0 is an error since numpy 2.4), and `tl.dot` on
bfloat16 multiplies the raw uint16 bit patterns. Both shims touch the interpreter only.
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
