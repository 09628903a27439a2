"""Convolution and pooling modules with torch.nn's names, arguments, parameter names and initialisation.

Layout is channels-first as in PyTorch: (N, C, L), (N, C, H, W), (N, C, D, H, W); an unbatched input
(C, *spatial) is accepted too. The layers are implemented in the C++ core; these classes only turn
PyTorch-style arguments (an int or a tuple) into the lists the core takes.
"""
import numbers

from .. import _core
from ..functional_extra import pad as _pad
from ..trace_state import _tracing
from .module import Module, _check_cpu, _NativeModule, _int_args

__all__ = [
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "GlobalAvgPool2d",
]
_F = _core.functional


def _dims(layer, name, value, nd, allow_none=False):
    """An int or a tuple of nd ints (PyTorch's _single/_pair/_triple) as a list of nd ints."""
    if isinstance(value, bool):
        raise TypeError(f"{layer}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    if isinstance(value, int) or (allow_none and value is None):
        value = (value,) * nd
    try:
        values = list(value)
    except TypeError:
        raise TypeError(f"{layer}: {name} must be an int or a tuple of {nd} ints, got {value!r}") from None
    if len(values) != nd:
        raise ValueError(f"{layer}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    for v in values:
        if not (isinstance(v, int) and not isinstance(v, bool)) and not (allow_none and v is None):
            raise TypeError(f"{layer}: {name} must be an int or a tuple of {nd} ints, got {value!r}")
    return values


def _check_device(layer, device):
    _check_cpu(device, layer)


def _dtype(dtype):
    if dtype is None:
        return "float32"
    name = getattr(dtype, "__name__", None) or str(dtype)
    return name.replace("torch.", "")  # accepts torch.float64 as well as "float64" and numpy dtypes


def _pad_tuple(padding, kernel, dilation):
    """F.pad's tuple (last dim first) for a conv's padding: ints per dim, 'valid', or 'same' (torch's
    split: the left side gets the smaller half)."""
    if padding == "valid":
        per_dim = [(0, 0)] * len(kernel)
    elif padding == "same":
        per_dim = [((d * (k - 1)) // 2, d * (k - 1) - (d * (k - 1)) // 2) for k, d in zip(kernel, dilation)]
    else:
        per_dim = [(p, p) for p in padding]
    return [side for pair in reversed(per_dim) for side in pair]


class _WeightedModule(_NativeModule):
    """weight / bias properties: writable numpy views of the parameters (as Linear has)."""

    @property
    def weight(self):
        return dict(self._native.named_parameters())["weight"].data

    @property
    def bias(self):
        params = dict(self._native.named_parameters())
        return params["bias"].data if "bias" in params else None


class _ConvNd(_WeightedModule):
    _nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None):
        layer, nd = type(self).__name__, self._nd
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"{layer}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', "
                             f"got {padding_mode!r}")
        _check_device(layer, device)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{layer}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
            pad = padding
        else:
            pad = _dims(layer, "padding", padding, nd)
        k, s, d = (_dims(layer, n, v, nd) for n, v in
                   (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)))
        in_channels, out_channels, groups = _int_args(self, in_channels=in_channels, out_channels=out_channels,
                                                      groups=groups)
        # Another padding_mode pads the input first (F.pad, torch's own construction) and convolves
        # without padding.
        self._mode_pad = None if padding_mode == "zeros" else _pad_tuple(pad, k, d)
        native_pad = pad if self._mode_pad is None else [0] * nd
        super().__init__(_core.Conv(nd, in_channels, out_channels, k, s, native_pad, d, groups, bool(bias),
                                    _dtype(dtype)))
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = tuple(k), tuple(s), tuple(d)
        self.padding = pad if isinstance(pad, str) else tuple(pad)
        self.padding_mode = padding_mode

    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        if self._mode_pad is not None:
            x = _pad(x, self._mode_pad, self.padding_mode)
        return self._native.forward(x)

    def config(self):
        """Constructor arguments (tl.save / tl.load rebuild the layer from them)."""
        return {"in_channels": int(self.in_channels), "out_channels": int(self.out_channels),
                "kernel_size": list(self.kernel_size), "stride": list(self.stride),
                "padding": self.padding if isinstance(self.padding, str) else list(self.padding),
                "dilation": list(self.dilation), "groups": int(self.groups),
                "bias": any(n == "bias" for n, _ in self._native.named_parameters()),
                "padding_mode": self.padding_mode}

    def extra_repr(self):
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._nd:
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * self._nd:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Conv1d(_ConvNd):
    """1-d convolution over (N, C, L); weight (out_channels, in_channels/groups, k)."""
    _nd = 1


class Conv2d(_ConvNd):
    """2-d convolution over (N, C, H, W); weight (out_channels, in_channels/groups, kH, kW)."""
    _nd = 2


class Conv3d(_ConvNd):
    """3-d convolution over (N, C, D, H, W); weight (out_channels, in_channels/groups, kD, kH, kW)."""
    _nd = 3


class _ConvTransposeNd(_WeightedModule):
    _nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        layer, nd = type(self).__name__, self._nd
        if padding_mode != "zeros":
            raise ValueError(f"{layer}: padding_mode={padding_mode!r} is not supported (only 'zeros')")
        _check_device(layer, device)
        if isinstance(padding, str):
            raise ValueError(f"{layer}: padding must be an int or a tuple, got {padding!r}")
        args = [_dims(layer, n, v, nd) for n, v in (("kernel_size", kernel_size), ("stride", stride),
                                                    ("padding", padding), ("output_padding", output_padding),
                                                    ("dilation", dilation))]
        k, s, p, op, d = args
        in_channels, out_channels, groups = _int_args(self, in_channels=in_channels, out_channels=out_channels,
                                                      groups=groups)
        super().__init__(_core.ConvTranspose(nd, in_channels, out_channels, k, s, p, op, groups,
                                             bool(bias), d, _dtype(dtype)))
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding = tuple(k), tuple(s), tuple(p)
        self.output_padding, self.dilation = tuple(op), tuple(d)

    def forward(self, input, output_size=None):  # noqa: A002 (torch's keywords)
        """torch's forward: output_size (the spatial sizes, optionally with N and C first) picks the
        output padding that reaches it, within stride - 1 of the smallest size, as torch does."""
        if output_size is None:
            return self._native.forward(input)
        padding = self._output_padding(input, output_size)
        graph = _tracing.graph
        params = dict(self._native.named_parameters())
        bias = graph.parameter(params["bias"]) if "bias" in params else None
        return _unbatched(input, self._nd, lambda x: getattr(_F, f"conv_transpose{self._nd}d")(
            x, graph.parameter(params["weight"]), bias, list(self.stride), list(self.padding), padding,
            self.groups, list(self.dilation)))

    def _output_padding(self, input, output_size):
        nd, layer = self._nd, type(self).__name__
        size = [int(v) for v in output_size]
        leading = input.ndim - nd  # 2 batched, 1 unbatched
        if len(size) == nd + leading:
            size = size[leading:]
        if len(size) != nd:
            raise ValueError(f"{layer}: for {nd + leading}-D input, output_size must have {nd} or {nd + leading} "
                             f"elements (got {len(output_size)})")
        smallest = [(input.shape[leading + i] - 1) * self.stride[i] - 2 * self.padding[i]
                    + self.dilation[i] * (self.kernel_size[i] - 1) + 1 for i in range(nd)]
        largest = [m + s - 1 for m, s in zip(smallest, self.stride)]
        if any(not lo <= v <= hi for v, lo, hi in zip(size, smallest, largest)):
            raise ValueError(f"{layer}: requested an output size of {size}, but valid sizes range from {smallest} "
                             f"to {largest} (for an input of {list(input.shape[leading:])})")
        return [v - lo for v, lo in zip(size, smallest)]

    def config(self):
        return {"in_channels": int(self.in_channels), "out_channels": int(self.out_channels),
                "kernel_size": list(self.kernel_size), "stride": list(self.stride), "padding": list(self.padding),
                "output_padding": list(self.output_padding), "groups": int(self.groups),
                "bias": any(n == "bias" for n, _ in self._native.named_parameters()), "dilation": list(self.dilation)}

    def extra_repr(self):
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        for name, default in (("padding", 0), ("output_padding", 0), ("dilation", 1)):
            if getattr(self, name) != (default,) * self._nd:
                text += f", {name}={getattr(self, name)}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class ConvTranspose1d(_ConvTransposeNd):
    """Transposed 1-d convolution; weight (in_channels, out_channels/groups, k)."""
    _nd = 1


class ConvTranspose2d(_ConvTransposeNd):
    """Transposed 2-d convolution; weight (in_channels, out_channels/groups, kH, kW)."""
    _nd = 2


class ConvTranspose3d(_ConvTransposeNd):
    """Transposed 3-d convolution; weight (in_channels, out_channels/groups, kD, kH, kW)."""
    _nd = 3


class _MaxPoolNd(_NativeModule):
    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        layer, nd = type(self).__name__, self._nd
        k = _dims(layer, "kernel_size", kernel_size, nd)
        s = [] if stride is None else _dims(layer, "stride", stride, nd)
        p, d = _dims(layer, "padding", padding, nd), _dims(layer, "dilation", dilation, nd)
        super().__init__(_core.MaxPool(nd, k, s, p, d, bool(ceil_mode)))
        self.kernel_size, self.stride = kernel_size, kernel_size if stride is None else stride
        self.padding, self.dilation, self.ceil_mode = padding, dilation, ceil_mode
        self.return_indices = bool(return_indices)
        self._args = (k, s or k, p, d, bool(ceil_mode))

    def forward(self, input):  # noqa: A002 (torch's keyword)
        """The pooled values; with return_indices, (values, int64 indices of each maximum within its
        flattened input plane), the indices MaxUnpool takes (they carry no gradient)."""
        x = input
        if not self.return_indices:
            return self._native.forward(x)
        return _unbatched(x, self._nd, lambda xb: getattr(_F, f"max_pool{self._nd}d")(
            xb, *self._args[:4], ceil_mode=self._args[4], return_indices=True))

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "return_indices": self.return_indices, "ceil_mode": bool(self.ceil_mode)}

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


def _unbatched(x, nd, fn):
    """fn on a batched (N, C, *spatial) input; an unbatched (C, *spatial) one runs as a batch of one
    (torch's rule), each result losing the batch axis again."""
    if x.ndim != nd + 1:
        return fn(x)
    out = fn(_F.unsqueeze(x, 0))
    return tuple(_F.squeeze(o, 0) for o in out) if isinstance(out, tuple) else _F.squeeze(out, 0)


class _MaxUnpoolNd(Module):
    """torch's MaxUnpool: the values of a max pooling written back at their indices, zeros elsewhere;
    forward(input, indices, output_size=None). The output size defaults to (in - 1) * stride - 2 *
    padding + kernel_size per spatial dim (output_size picks another within stride of it). Where
    overlapping windows chose one element twice, it is written once. The gradient gathers at the
    indices."""
    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        layer, nd = type(self).__name__, self._nd
        self._args = (_dims(layer, "kernel_size", kernel_size, nd),
                      None if stride is None else _dims(layer, "stride", stride, nd), _dims(layer, "padding", padding, nd))
        self.kernel_size, self.stride, self.padding = kernel_size, kernel_size if stride is None else stride, padding

    def forward(self, input, indices, output_size=None):  # noqa: A002 (torch's name)
        size = None if output_size is None else [int(v) for v in output_size]
        fn = getattr(_F, f"max_unpool{self._nd}d")
        if input.ndim == self._nd + 1:  # unbatched (C, *spatial)
            return _F.squeeze(fn(_F.unsqueeze(input, 0), _F.unsqueeze(indices, 0), *self._args, output_size=size), 0)
        return fn(input, indices, *self._args, output_size=size)

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding}

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    _nd = 3


class MaxPool1d(_MaxPoolNd):
    _nd = 1


class MaxPool2d(_MaxPoolNd):
    _nd = 2


class MaxPool3d(_MaxPoolNd):
    _nd = 3


class _AvgPoolNd(_NativeModule):
    _nd = 2

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        layer, nd = type(self).__name__, self._nd
        k = _dims(layer, "kernel_size", kernel_size, nd)
        s = [] if stride is None else _dims(layer, "stride", stride, nd)
        p = _dims(layer, "padding", padding, nd)
        if divisor_override is not None:
            if isinstance(divisor_override, bool) or not isinstance(divisor_override, numbers.Integral):
                raise TypeError(f"{layer}: divisor_override must be an int or None, got {divisor_override!r}")
            if divisor_override <= 0:
                raise ValueError(f"{layer}: divisor_override must be positive, got {divisor_override}")
        super().__init__(_core.AvgPool(nd, k, s, p, bool(ceil_mode), bool(count_include_pad),
                                       int(divisor_override or 0)))
        self.kernel_size, self.stride = kernel_size, kernel_size if stride is None else stride
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def config(self):
        cfg = {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
               "ceil_mode": bool(self.ceil_mode), "count_include_pad": bool(self.count_include_pad)}
        if self.divisor_override is not None:
            cfg["divisor_override"] = int(self.divisor_override)
        return cfg

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool1d(_AvgPoolNd):
    _nd = 1

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)


class AvgPool2d(_AvgPoolNd):
    _nd = 2


class AvgPool3d(_AvgPoolNd):
    _nd = 3


class _AdaptiveAvgPoolNd(_NativeModule):
    _nd = 2

    def __init__(self, output_size):
        layer, nd = type(self).__name__, self._nd
        size = _dims(layer, "output_size", output_size, nd, allow_none=True)
        # The core reads -1 as "keep the input's size" (None); a negative size given here is an error.
        if any(v is not None and v < 1 for v in size):
            raise ValueError(f"{layer}: output_size must be positive (or None), got {output_size!r}")
        super().__init__(_core.AdaptiveAvgPool(nd, [-1 if v is None else v for v in size]))
        self.output_size = output_size

    def config(self):
        return {"output_size": self.output_size}

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    _nd = 1


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
    _nd = 2


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    _nd = 3


class GlobalAvgPool2d(_NativeModule):
    """Mean over H and W, returned flat as (N, C): AdaptiveAvgPool2d(1) followed by Flatten()."""

    def config(self):
        return {}

    def __init__(self):
        super().__init__(_core.GlobalAvgPool2d())

