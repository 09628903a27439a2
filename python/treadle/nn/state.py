"""A module's parameters and buffers as torch exposes them (named_parameters, buffers, state_dict,
requires_grad_, ...), over the core parameters that live in the compiled model's flat buffer."""
import weakref

import numpy as np

# Root modules compiled into a model (requires_grad_ on any submodule repacks their flat buffers).
_compiled_roots = weakref.WeakSet()


class _NamedParameters(dict):
    """A dict name -> parameter view that iterates (name, view) pairs, so that both
    `net.named_parameters()["0.weight"]` and torch's `for name, p in net.named_parameters()` work."""

    def __iter__(self):
        return iter(list(self.items()))


def _load_into(objects, expected, state, strict):
    """load_state_dict for a submodule, whose parameters may live in its root's flat buffer: every
    key, shape and dtype is checked before anything is written."""
    values = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in state.items()}
    missing, unexpected = sorted(set(expected) - set(values)), sorted(set(values) - set(objects))
    if strict and (missing or unexpected):
        raise ValueError(f"load_state_dict: {'missing key' if missing else 'unexpected key'} "
                         f"'{(missing or unexpected)[0]}'")
    for name, value in values.items():
        if name not in objects:
            continue
        target = objects[name].data
        if value.shape != target.shape:
            raise ValueError(f"load_state_dict: '{name}' has shape {value.shape}, expected {target.shape}")
        if value.dtype.kind not in "fiu" or (value.dtype.kind != "f" and objects[name].requires_grad):
            raise TypeError(f"load_state_dict: '{name}' has dtype {value.dtype}")
    for name, value in values.items():
        if name in objects:
            objects[name].data[...] = value


class _ParameterState:
    """Module's parameter and buffer methods (a mixin: Module defines the storage and _compiled)."""

    def _own_parameters(self):
        """(name, core parameter) for this module's own parameters, then its own buffers (state_dict
        order)."""
        own = [(n, p) for n, p in self._parameters.items() if p is not None]
        return own + [(n, b) for n, b in self._buffers.items() if b is not None]

    def _own_buffer_names(self):
        return [n for n, b in self._buffers.items() if b is not None] + list(self._native_buffers)

    def _buffer_names(self, prefix=""):
        """Full names of every buffer at and below this module; (persistent, non-persistent)."""
        kept, dropped = [], []
        for n in self._own_buffer_names():
            (dropped if n in self._non_persistent else kept).append(prefix + n)
        for name, child in self._modules.items():
            k, d = child._buffer_names(prefix + name + ".")
            kept += k
            dropped += d
        return kept, dropped

    def named_parameter_objects(self, prefix=""):
        """(name, Parameter) pairs in state_dict order (PyTorch naming: "0.weight")."""
        out = [(prefix + n, p) for n, p in self._own_parameters()]
        for name, child in self._modules.items():
            out.extend(child.named_parameter_objects(prefix + name + "."))
        return out

    def named_parameters(self):
        """name -> writable numpy view of each parameter (in the model's flat buffer once compiled).
        Indexes like a dict; iterates (name, view) pairs, as torch's named_parameters(). Buffers
        (named_buffers) are not parameters. A submodule's views are into its root's flat buffer once
        the root is compiled (a submodule is never compiled on its own for this)."""
        self._compile_if_root()
        return _NamedParameters((n, p.data) for n, p in self._unique_parameter_objects())

    def named_buffers(self):
        """(name, writable numpy view) of each buffer: register_buffer's and batch norm's running
        statistics, as torch's named_buffers()."""
        self._compile_if_root()
        kept, dropped = self._buffer_names()
        names = set(kept + dropped)
        return iter([(n, p.data) for n, p in self._unique_objects() if n in names])

    def buffers(self):
        return [view for _, view in self.named_buffers()]

    def requires_grad_(self, requires_grad=True):
        """Sets requires_grad on every parameter of this module (torch's requires_grad_, e.g. to freeze
        an encoder); returns self. A compiled model re-packs its flat buffer (trainable values first):
        create the Trainer after freezing."""
        changed = set()
        for _, p in self._unique_parameter_objects():
            if p.requires_grad != bool(requires_grad):
                p.requires_grad = bool(requires_grad)
                changed.add(p.owner_id)
        for root in list(_compiled_roots):
            model = root.__dict__.get("_model")
            if model is not None and model.id in changed:
                model.to(model.dtype)  # re-packs: the layout puts trainable values first
        return self

    def zero_grad(self, set_to_none=True):
        """Zeroes the model's gradient buffer (treadle's gradients always exist: set_to_none is
        accepted for torch's signature and zeroes them too)."""
        self._compiled().zero_grad()

    def parameters(self):
        """The writable numpy view of each parameter, in state_dict order (shared ones once)."""
        return [view for _, view in self.named_parameters().items()]

    def _unique_objects(self):
        """Parameters and buffers, shared (tied) ones once under their first name."""
        seen = set()
        return [(n, p) for n, p in self.named_parameter_objects() if not (id(p) in seen or seen.add(id(p)))]

    def _unique_parameter_objects(self):
        """Parameters (not buffers), tied ones once under their first name, as torch's named_parameters."""
        kept, dropped = self._buffer_names()
        buffers = set(kept + dropped)
        return [(n, p) for n, p in self._unique_objects() if n not in buffers]

    def named_gradients(self):
        """Dict name -> writable numpy view of each parameter's gradient."""
        model = self._compiled()
        kept, dropped = self._buffer_names()
        buffers = set(kept + dropped)  # not trained: no gradient (as torch's buffers have none)
        return {name: model.gradient(name) for name, _shape, _offset in model.layout if name not in buffers}

    def flat_parameters(self):
        """The one contiguous parameter buffer as a writable numpy view."""
        return self._compiled().flat_parameters()

    def flat_gradients(self):
        """The one contiguous gradient buffer as a writable numpy view."""
        return self._compiled().flat_gradients()

    def num_parameters(self):
        """Number of trainable values (like sum(p.numel() for p in torch_module.parameters()))."""
        return sum(int(np.prod(p.shape)) for _, p in self._unique_parameter_objects() if p.requires_grad)

    def _aliases(self):
        """name -> the first name of the same (tied) parameter, for every name."""
        objects = self.named_parameter_objects()  # kept alive: ids identify shared parameters
        first = {}
        for n, p in objects:
            first.setdefault(id(p), n)
        return {n: first[id(p)] for n, p in objects}

    def _compile_if_root(self):
        if not self._is_child:
            self._compiled()

    def state_dict(self):
        """Dict name -> numpy copy of each parameter and persistent buffer, with PyTorch's keys and
        layouts (a tied parameter under each of its names, as torch lists it)."""
        _, dropped = self._buffer_names()
        if self._is_child and self.__dict__.get("_model") is None:  # values wherever they live now
            objects = dict(self._unique_objects())
            return {n: objects[first].data.copy() for n, first in self._aliases().items() if n not in dropped}
        state = self._compiled().state_dict()
        return {n: state[first] for n, first in self._aliases().items() if n not in dropped}

    def load_state_dict(self, state, strict=True):
        """Loads parameters and persistent buffers from numpy arrays or torch tensors; validates
        everything before writing."""
        state, alias = dict(state), self._aliases()
        _, dropped = self._buffer_names()
        if strict and set(dropped) & set(state):
            raise ValueError(f"load_state_dict: unexpected key '{sorted(set(dropped) & set(state))[0]}' "
                             "(a non-persistent buffer is not part of the state)")
        # torch's state_dict lists a tied parameter under every name: load it once, by its first name.
        # Non-persistent buffers keep their values.
        state = {k: v for k, v in state.items() if alias.get(k, k) == k and k not in dropped}
        current = dict(self._unique_objects())
        if self._is_child and self.__dict__.get("_model") is None:
            return _load_into(current, {k: v for k, v in current.items() if k not in dropped}, state, strict)
        if strict:
            state.update({n: current[n].data for n in dropped if n in current})
        self._compiled().load_state_dict(state, strict)
