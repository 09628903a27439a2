"""Modules, named and initialised like torch.nn so a model ports by renaming the import.

A module's `forward` runs once per input signature, on symbolic tensors, to record the graph that
treadle compiles; it is not called per step. Write it with the ops in `treadle.functional` and the
operators +, -, * (residual and branching models are ordinary Python in forward).

The base classes are in module.py, the layers in the files beside it (each imports the base, never
this file); this file only gathers their names.
"""
from . import init  # noqa: F401 (tl.nn.init, as torch.nn.init)
from . import utils  # noqa: F401 (tl.nn.utils, as torch.nn.utils)
from . import activations
from .activations import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .containers import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .module import Module
from .parameter import Parameter
from .recurrent import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
# torch.nn's loss classes (also in tl.loss); torch code reaches them as nn.MSELoss(), ...
from .losses import *  # noqa: F401,F403

# Helpers that treadle.nn has always exposed under these names (the trainer, the tensor factories
# and code written against them import them from here).
from ..trace_state import _dtype_name, _tracing  # noqa: F401
from .inputs import _flatten_inputs, _is_list_data, _list_data, _nested_inputs, _unflatten_inputs  # noqa: F401
from .module import (  # noqa: F401
    _NativeModule, _check_cpu, _flatten_outputs, _int_arg, _int_args, _name_the_module, _shaped_input, _structured)
from .parameter import _as_parameter, _default_float, _host_array  # noqa: F401
from .state import _compiled_roots, _ParameterState  # noqa: F401

# `from treadle.nn import *` gives these names, as it always has, and every activation module (the
# pointwise ones come from the core's list of them).
__all__ = ["Module", "Parameter", "Sequential", "ModuleList", "ModuleDict", "Linear", *activations.__all__, "Dropout",
           "Flatten", "Identity"]
