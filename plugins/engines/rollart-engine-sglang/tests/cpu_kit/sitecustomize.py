"""TEST-ONLY import shims that let SGLang 0.5.23 run on its CPU engine here (see ../../README.md).

On PYTHONPATH only inside ci.sh's SGLang venv, so that SGLang's scheduler subprocesses get
it too. Never shipped with the plugin.

- torchvision: the PyPI wheel for torch 2.13 is a CUDA build whose ``_C`` extension does not
  load next to the CPU torch; its ``_meta_registrations`` (fake-tensor kernels for its C++
  ops, used only under torch.compile) then fails at import. SGLang imports torchvision's
  pure-Python transforms for its multimodal processors, which do not need those ops.
"""

import sys
import types

sys.modules.setdefault(
    "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
)
