"""tl.nn.Parameter and what turns an assigned value into a core parameter."""
import numpy as np

from .. import _core


def _default_float(data, dtype):
    """float32 (torch's default dtype) unless asked, or unless `data` is a float64 torch tensor (an
    explicit choice in torch code; numpy's float64 default is not one)."""
    if dtype is not None:
        return dtype
    return "float64" if str(getattr(data, "dtype", "")) == "torch.float64" else "float32"


def _host_array(data):
    return data.detach().cpu().numpy() if hasattr(data, "detach") else data


def Parameter(data, requires_grad=True, dtype=None):  # noqa: N802 (torch.nn.Parameter's name)
    """A tensor a module trains (torch.nn.Parameter). Assigned as a module attribute
    (``self.scale = tl.nn.Parameter(np.ones(8))``) it is registered under that name: it joins the
    model's flat buffer, its state_dict and its optimizer. In forward, ``self.scale`` is its symbol;
    elsewhere a writable numpy view. Assigning another module's parameter ties the two (one value, one
    gradient): ``self.decoder.weight = self.encoder.weight``. The data is copied, as float32 unless
    `dtype` says otherwise (or `data` is a float64 torch tensor); ``model.double()`` converts all."""
    return _core.Parameter(_host_array(data), bool(requires_grad), _default_float(data, dtype))


def _as_parameter(value):
    """The core parameter `value` stands for: a Parameter, or a numpy view of one whole parameter (what
    ``module.weight`` returns, so ``dec.weight = enc.weight`` ties); None for anything else."""
    if isinstance(value, _core.Parameter):
        return value
    owner = value.base if isinstance(value, np.ndarray) else None
    if isinstance(owner, _core.Parameter):
        whole = owner.data
        if (value.shape == whole.shape and value.strides == whole.strides
                and value.__array_interface__["data"][0] == whole.__array_interface__["data"][0]):
            return owner
    return None
