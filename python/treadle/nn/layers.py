"""Linear, dropout, normalisation, embedding and small layers, with torch.nn's arguments, parameter
names and initialisation.

Training plans (Trainer.step, Trainer.forward) run these layers in training mode and inference or
evaluation (predict, Trainer.evaluate) in eval mode, like torch's module.train() / module.eval():
BatchNorm normalises with batch statistics and updates running_mean / running_var while training,
and uses the running statistics otherwise.

Non-trained state is stored as parameters with requires_grad=False: BatchNorm's running_mean,
running_var and num_batches_tracked (the state_dict keys torch uses; num_batches_tracked is kept in
the model's float dtype, and torch's int64 value loads into it), and OutputTransform's fixed scale
and shift. They receive no gradient and only training steps write them.
"""
import numbers

import numpy as np

from .. import _core
from .. import functional as F
from .module import _NativeModule, _int_arg, _int_args

__all__ = [
    "Linear", "Dropout", "Flatten", "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "Embedding", "Unflatten", "Upsample", "OutputTransform",
]


class Linear(_NativeModule):
    """y = x W^T + b with W of shape (out_features, in_features); PyTorch's default initialisation."""

    def __init__(self, in_features, out_features, bias=True, dtype="float32"):
        super().__init__(_core.Linear(_int_arg(self, "in_features", in_features),
                                      _int_arg(self, "out_features", out_features), bool(bias), dtype))
        self.in_features, self.out_features, self.has_bias = in_features, out_features, bias

    @property
    def weight(self):
        return dict(self._native.named_parameters())["weight"].data

    @property
    def bias(self):
        params = dict(self._native.named_parameters())
        return params["bias"].data if "bias" in params else None

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"


class Dropout(_NativeModule):
    """Zeroes elements with probability p in training (scaling the rest by 1/(1-p)); identity in predict.
    torch's inplace flag is accepted and has nothing to do (every value has its own arena slot)."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__(_core.Dropout(float(p)))
        self.p = p


class Flatten(_NativeModule):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__(_core.Flatten(int(start_dim), int(end_dim)))
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)


def _dtype(dtype):
    return "float32" if dtype is None else dtype


def _shape(shape, what):
    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if is_int(shape):
        return [int(shape)]
    try:
        dims = list(shape)
    except TypeError:
        raise TypeError(f"{what}: expected an int or a sequence of ints, got {type(shape).__name__}") from None
    if not all(is_int(d) for d in dims):
        raise TypeError(f"{what}: expected an int or a sequence of ints, got {shape!r}")
    return [int(d) for d in dims]


class _WithParams(_NativeModule):
    """Native layer whose parameters are exposed as attributes (writable numpy views, None if absent)."""

    def _param(self, name):
        for n, p in self._native.named_parameters():
            if n == name:
                return p.data
        return None

    @property
    def weight(self):
        return self._param("weight")

    @property
    def bias(self):
        return self._param("bias")


class LayerNorm(_WithParams):
    """Normalises over the trailing `normalized_shape` dimensions; weight=1, bias=0 when elementwise_affine."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, dtype=None):
        shape = _shape(normalized_shape, "LayerNorm")
        super().__init__(_core.LayerNorm(shape, float(eps), bool(elementwise_affine), bool(bias), _dtype(dtype)))
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(shape), eps, elementwise_affine

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(_WithParams):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing dimensions; eps=None is the dtype's machine epsilon."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, dtype=None):
        shape = _shape(normalized_shape, "RMSNorm")
        super().__init__(_core.RMSNorm(shape, None if eps is None else float(eps), bool(elementwise_affine),
                                       _dtype(dtype)))
        self.normalized_shape, self.eps, self.elementwise_affine = tuple(shape), eps, elementwise_affine

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    def forward(self, x):  # torch's RMSNorm names its input x
        return self._native.forward(x)


class GroupNorm(_WithParams):
    """Input (N, C, *): statistics per sample over groups of C / num_groups channels; per-channel affine."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, dtype=None, *, bias=True):
        num_groups, num_channels = _int_args(self, num_groups=num_groups, num_channels=num_channels)
        super().__init__(_core.GroupNorm(num_groups, num_channels, float(eps), bool(affine), _dtype(dtype), bool(bias)))
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _BatchNorm(_WithParams):
    _dims = 0
    _native_buffers = ("running_mean", "running_var", "num_batches_tracked")

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, dtype=None, *,
                 bias=True):
        num_features = _int_args(self, num_features=num_features)
        super().__init__(_core.BatchNorm(self._dims, num_features, float(eps),
                                         None if momentum is None else float(momentum), bool(affine),
                                         bool(track_running_stats), _dtype(dtype), bool(bias)))
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats

    @property
    def running_mean(self):
        return self._param("running_mean")

    @property
    def running_var(self):
        return self._param("running_var")

    @property
    def num_batches_tracked(self):
        v = self._param("num_batches_tracked")
        return None if v is None else int(v)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Input (N, C) or (N, C, L). Training: batch statistics, running statistics updated (unbiased
    variance, `momentum`; None = cumulative average). predict / evaluate: running statistics."""
    _dims = 1


class BatchNorm2d(_BatchNorm):
    """Input (N, C, H, W); see BatchNorm1d."""
    _dims = 2


class BatchNorm3d(_BatchNorm):
    """Input (N, C, D, H, W); see BatchNorm1d."""
    _dims = 3


class Embedding(_WithParams):
    """Rows of weight (num_embeddings, embedding_dim) picked by integer indices of any shape.

    weight ~ N(0, 1) with the padding_idx row zeroed; that row receives no gradient. Indices outside
    [0, num_embeddings) raise ValueError naming the index. Models taking indices accept int64 input.
    torch's options: max_norm / norm_type rescale each looked-up row whose norm exceeds max_norm to
    max_norm / (norm + 1e-7), in place in weight on a training step as torch does (a prediction scales
    the rows it returns and leaves weight unchanged: predictions never write parameters);
    scale_grad_by_freq divides each index's gradient by its count in the batch; sparse=True gives the
    same gradient values, stored dense; _weight initialises weight with a copy of an array and _freeze
    freezes it (as from_pretrained does).
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, dtype=None):
        num_embeddings, embedding_dim = _int_args(self, num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        if padding_idx is not None:
            padding_idx = _int_args(self, padding_idx=padding_idx)
        super().__init__(_core.Embedding(num_embeddings, embedding_dim, padding_idx, _dtype(dtype),
                                         None if max_norm is None else float(max_norm), float(norm_type),
                                         bool(scale_grad_by_freq)))
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = None if padding_idx is None else self._native.padding_idx
        self.max_norm, self.norm_type = max_norm, float(norm_type)
        self.scale_grad_by_freq, self.sparse = bool(scale_grad_by_freq), bool(sparse)
        if _weight is not None:
            weight = np.asarray(_weight.detach().cpu().numpy() if hasattr(_weight, "detach") else _weight)
            if weight.shape != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight of shape {weight.shape} does not match num_embeddings and "
                                 f"embedding_dim ({num_embeddings}, {embedding_dim})")
            self.weight[...] = weight
        if _freeze:
            self.requires_grad_(False)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """torch's Embedding.from_pretrained: a layer whose weight is a copy of the 2-D `embeddings`
        (numpy or torch), frozen unless freeze=False; the padding row is kept as given."""
        weight = np.asarray(embeddings.detach().cpu().numpy() if hasattr(embeddings, "detach") else embeddings)
        if weight.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got shape {weight.shape}")
        dtype = weight.dtype if weight.dtype in (np.float32, np.float64) else np.float32
        return cls(weight.shape[0], weight.shape[1], padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=weight, _freeze=freeze, dtype=dtype)

    def extra_repr(self):
        extra = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            extra += f", max_norm={self.max_norm}" + ("" if self.norm_type == 2.0 else f", norm_type={self.norm_type}")
        if self.scale_grad_by_freq:
            extra += ", scale_grad_by_freq=True"
        if self.sparse:
            extra += ", sparse=True"
        return f"{self.num_embeddings}, {self.embedding_dim}{extra}"


class Unflatten(_NativeModule):
    """Splits dimension `dim` into `unflattened_size` (one entry may be -1)."""

    def __init__(self, dim, unflattened_size):
        if isinstance(unflattened_size, numbers.Integral):  # torch takes a tuple (or list) only
            raise TypeError(f"Unflatten: unflattened_size must be a tuple of ints, got int {unflattened_size}")
        sizes = _shape(unflattened_size, "Unflatten")
        dim = _int_args(self, dim=dim)
        super().__init__(_core.Unflatten(dim, sizes))
        self.dim, self.unflattened_size = dim, tuple(sizes)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class Upsample(_NativeModule):
    """Resamples to `size` or by `scale_factor` with torch's rules: 'nearest' and 'nearest-exact' (3-,
    4-, 5-D), 'linear' (3-D), 'bilinear' and 'bicubic' (4-D), 'trilinear' (5-D), 'area' (see
    F.interpolate). 4-D input is the native op itself; the rest compose it (F.interpolate)."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        if (size is None) == (scale_factor is None):
            raise ValueError("Upsample: give exactly one of size and scale_factor")
        sizes = [] if size is None else _shape(size, "Upsample size")
        if scale_factor is None:
            scales = []
        elif isinstance(scale_factor, numbers.Real):
            scales = [float(scale_factor)]
        else:
            scales = [float(s) for s in scale_factor]
        corners = None if align_corners is None else bool(align_corners)
        mode = str(mode)
        if mode in ("linear", "trilinear", "area") or len(sizes or scales) == 3:
            # Composed in forward; the native op checks the values (positive sizes and factors) here.
            if mode not in ("nearest", "nearest-exact", "linear", "trilinear", "area"):
                raise ValueError(f"Upsample: mode {mode!r} does not take 3 sizes or factors")
            if corners is not None and mode == "area":
                raise ValueError("Upsample: align_corners can only be set with a linear mode")
            for v in sizes or scales:  # one value at a time: the native checks take at most two
                _core.Upsample([v] if sizes else [], [] if sizes else [v], "nearest", None,
                               bool(recompute_scale_factor))
            native = _core.Upsample([1], [], "nearest", None, False)  # holds no state; forward composes
        else:
            native = _core.Upsample(sizes, scales, mode, corners, bool(recompute_scale_factor))
        super().__init__(native)
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):  # noqa: A002 (torch's keyword)
        x = input
        if x.ndim == 4 and self.mode in ("nearest", "nearest-exact", "bilinear", "bicubic"):
            return self._native.forward(x)
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)

    def extra_repr(self):
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode='{self.mode}'"


class OutputTransform(_WithParams):
    """Maps outputs onto bounded targets: y_j = act_j(x_j) * scale_j + shift_j for each output j.

    scale and shift: a number or one value per output; activations: one of 'identity', 'softplus',
    'sigmoid', 'tanh', or one per output. E.g. a target in (a, b): activations='sigmoid', scale=b - a,
    shift=a; a positive target: 'softplus'. scale and shift are fixed (not trained) and are saved in
    the state_dict as 'scale' and 'shift' (buffers: named_buffers lists them, parameters() does not).
    """
    _native_buffers = ("scale", "shift")

    def __init__(self, scale=1.0, shift=0.0, activations="identity", dtype=None):
        def values(v, what):
            if isinstance(v, numbers.Real):
                return [float(v)]
            try:
                return [float(x) for x in v]
            except TypeError:
                raise TypeError(f"OutputTransform: {what} must be a number or a sequence of numbers") from None

        acts = [activations] if isinstance(activations, str) else [str(a) for a in activations]
        super().__init__(_core.OutputTransform(values(scale, "scale"), values(shift, "shift"), acts, _dtype(dtype)))
        self.activations = tuple(acts)

    @property
    def scale(self):
        return self._param("scale")

    @property
    def shift(self):
        return self._param("shift")

    def extra_repr(self):
        return f"num_outputs={self._native.num_outputs}, activations={self.activations}"
