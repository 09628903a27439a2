"""Containers (torch.nn's Sequential, ModuleList, ModuleDict) and Identity: modules that hold or pass
through others and add no op of their own."""
import numbers

from .module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict", "Identity"]


class Sequential(Module):
    """Modules applied in order; children are named "0", "1", ... as in torch.nn.Sequential."""

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(layer).__name__}, not a treadle Module")
            setattr(self, str(i), layer)

    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)


class ModuleList(Module):
    """Submodules in a list, registered with the model (torch.nn.ModuleList): parameters are named
    "<attribute>.<index>.<name>" as in torch. A container only: its owner's forward calls the layers."""

    def __init__(self, modules=None):
        super().__init__()
        self.extend(modules or [])

    def _check(self, module, where):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: {where} is a {type(module).__name__}, not a treadle Module")
        return module

    def append(self, module):
        setattr(self, str(len(self._modules)), self._check(module, f"element {len(self._modules)}"))
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def insert(self, index, module):
        items = list(self._modules.values())
        items.insert(index, self._check(module, f"element {index}"))
        self._invalidate()
        self._modules.clear()
        for i, m in enumerate(items):
            setattr(self, str(i), m)

    def _index(self, i):
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"ModuleList indices must be integers or slices, not {type(i).__name__}")
        n = len(self._modules)
        if not -n <= i < n:
            raise IndexError(f"ModuleList index {i} is out of range for {n} modules")
        return str(i % n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return self._modules[self._index(i)]

    def __setitem__(self, i, module):
        setattr(self, self._index(i), self._check(module, f"element {i}"))

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def forward(self, *inputs):
        raise NotImplementedError("ModuleList is a container and has no forward: call its modules in a loop")


class ModuleDict(Module):
    """Submodules by name, registered with the model (torch.nn.ModuleDict): parameters are named
    "<attribute>.<key>.<name>" as in torch. A container only: its owner's forward calls the layers."""

    def __init__(self, modules=None):
        super().__init__()
        self.update(modules or {})

    def __setitem__(self, key, module):
        if not isinstance(key, str) or not key or "." in key:
            raise KeyError(f"ModuleDict keys must be non-empty strings without '.', got {key!r}")
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {key!r} is a {type(module).__name__}, not a treadle Module")
        setattr(self, key, module)

    def __getitem__(self, key):
        return self._modules[key]

    def update(self, modules):
        for key, module in (modules.items() if hasattr(modules, "items") else modules):
            self[key] = module

    def __contains__(self, key):
        return key in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules))

    def keys(self):
        return list(self._modules.keys())

    def values(self):
        return list(self._modules.values())

    def items(self):
        return list(self._modules.items())

    def forward(self, *inputs):
        raise NotImplementedError("ModuleDict is a container and has no forward: call its modules by key")


class Identity(Module):
    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        return x
