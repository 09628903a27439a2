"""Property-based fuzzing of the layer modules against torch.nn (hypothesis): convolutions, pooling,
normalisation, embedding, upsampling, dropout, reshaping modules and the losses called directly.

Random hyperparameters (some invalid), input shapes near the valid one (batch 1, zero-size axes,
wrong sizes and ranks), dtypes, layouts (read-only, strided, Fortran) and special values. Each call
either matches torch with the same weights or raises ValueError/TypeError naming the module or op
and the offending value (fuzzmodules.py has the checks); training steps on the fuzzed input either
match torch's update or leave weights, optimizer state and step counts untouched.
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
torch = pytest.importorskip("torch")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import treadle as tl  # noqa: E402
from fuzzmodules import (DOCUMENTED, FLOATS, FUZZ, LAYOUTS, TOL, assert_matches, check_predict, to_torch,  # noqa: E402
                         check_step, expect_documented, fill, layout, near, torch_pair)


def _rng(data):
    return np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))


def _construct(make, names):
    """make() or None after a documented constructor error."""
    try:
        return make()
    except DOCUMENTED as e:
        expect_documented(e, names)
        return None


def _fuzz_layer(data, net, ref, shape, dtype, names, prefix="0.", step=True, nan_positions=True, lenient=()):
    """predict on an input near `shape` against torch, then (sometimes) training steps."""
    ref, net = torch_pair(ref, net, dtype, prefix)
    x = data.draw(near(shape, dtype))
    check_predict(net, ref, x, dtype, names, nan_positions, lenient)
    if step and data.draw(st.booleans()):
        x0 = fill(_rng(data), shape, dtype)
        check_step(net, ref, x0, x, names, _rng(data), prefix)


# ---- convolutions -------------------------------------------------------------------------------------------

CONV = {1: ("Conv1d", "ConvTranspose1d"), 2: ("Conv2d", "ConvTranspose2d"), 3: ("Conv3d", "ConvTranspose3d")}


@FUZZ
@given(nd=st.integers(1, 3), transpose=st.booleans(), dtype=st.sampled_from(FLOATS), bias=st.booleans(),
       data=st.data())
def test_fuzz_conv(nd, transpose, dtype, bias, data):
    name = CONV[nd][transpose]
    small = st.integers(1, 2) if nd == 3 else st.integers(1, 3)
    tup = lambda s: tuple(data.draw(s) for _ in range(nd))  # noqa: E731
    groups = data.draw(st.sampled_from([1, 1, 2]))
    cin, cout = (groups * data.draw(st.integers(1, 2)) for _ in range(2))
    k, s, p, d = tup(small), tup(st.integers(1, 2)), tup(st.integers(0, 2)), tup(st.integers(1, 2))
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, groups=groups, bias=bias)
    if transpose:  # torch wants output_padding below stride or dilation
        kw["output_padding"] = tuple(data.draw(st.integers(0, max(a, b) - 1)) for a, b in zip(s, d))
    elif data.draw(st.integers(0, 4)) == 0:
        kw["padding"] = data.draw(st.sampled_from(["same", "valid"]))
        kw["stride"] = 1
    if data.draw(st.integers(0, 5)) == 0:  # one invalid argument
        arg = data.draw(st.sampled_from(["kernel_size", "stride", "padding", "dilation", "groups", "cin"]))
        bad = data.draw(st.sampled_from([0, -1]))
        if arg == "cin":
            cin += 1 if groups > 1 else -cin
        elif arg == "groups":
            kw["groups"] = bad
        else:
            kw[arg] = (bad,) * nd if arg != "padding" or bad else (-1,) * nd
    names = (name, "conv")
    net = _construct(lambda: getattr(tl.nn, name)(cin, cout, dtype=dtype, **kw), names)
    if net is None:
        return
    torch.manual_seed(0)
    ref = getattr(torch.nn, name)(cin, cout, **kw)  # treadle accepted it: so must torch
    spatial = tuple(data.draw(st.integers(1 + transpose, 7 if nd < 3 else 4)) for _ in range(nd))
    shape = (data.draw(st.integers(1, 3)), cin) + spatial
    try:  # the geometry may not fit this input: then only the refusal is fuzzed
        tl.nn.Sequential(getattr(tl.nn, name)(cin, cout, dtype=dtype, **kw)).predict(np.zeros(shape, dtype))
        valid = True
    except ValueError:
        valid = False
    _fuzz_layer(data, tl.nn.Sequential(net), ref, shape, dtype, names, step=valid)


# ---- pooling ------------------------------------------------------------------------------------------------

@FUZZ
@given(nd=st.integers(1, 3), kind=st.sampled_from(["max", "avg", "adaptive"]), dtype=st.sampled_from(FLOATS),
       ceil_mode=st.booleans(), data=st.data())
def test_fuzz_pool(nd, kind, dtype, ceil_mode, data):
    tup = lambda lo, hi: tuple(data.draw(st.integers(lo, hi)) for _ in range(nd))  # noqa: E731
    k = tup(1, 3)
    kw = dict(kernel_size=k, stride=data.draw(st.sampled_from([None, tup(1, 3)])),
              padding=tuple(data.draw(st.integers(0, a // 2)) for a in k), ceil_mode=ceil_mode)
    if kind == "max":
        name, kw["dilation"] = f"MaxPool{nd}d", tup(1, 2)
    elif kind == "avg":
        name, kw["count_include_pad"] = f"AvgPool{nd}d", data.draw(st.booleans())
        if nd > 1 and data.draw(st.booleans()):
            kw["divisor_override"] = data.draw(st.integers(1, 5))
    else:
        name = f"AdaptiveAvgPool{nd}d"
        sizes = [1, 2, 3] + [None] * (nd > 1)  # torch takes None (keep the size) for 2-d and 3-d only
        kw = dict(output_size=tuple(data.draw(st.sampled_from(sizes)) for _ in range(nd)))
    if data.draw(st.integers(0, 5)) == 0:  # one invalid argument
        arg = data.draw(st.sampled_from(sorted(kw)))
        if arg not in ("ceil_mode", "count_include_pad"):
            kw[arg] = (data.draw(st.sampled_from([0, -1])),) * nd
    names = (name, "pool")
    net = _construct(lambda: getattr(tl.nn, name)(**kw), names)
    if net is None:
        return
    ref = getattr(torch.nn, name)(**kw)
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))) + tup(1, 6 if nd < 3 else 4)
    # torch's avg_pool3d (not 1d/2d) refuses a ceil_mode window larger than the input.
    _fuzz_layer(data, tl.nn.Sequential(net), ref, shape, dtype, names, step=False,
                lenient=("smaller than kernel size",))


class _Global(torch.nn.Module):
    def forward(self, x):
        return torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)


@FUZZ
@given(dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_global_avg_pool(dtype, data):
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(4))
    _fuzz_layer(data, tl.nn.Sequential(tl.nn.GlobalAvgPool2d()), _Global(), shape, dtype,
                ("GlobalAvgPool2d", "pool", "global_avg"), step=False)


# ---- normalisation ------------------------------------------------------------------------------------------

def _norm_pair(kind, c, dtype, data):
    """(name, treadle layer, torch layer, input shape) for a normalisation layer over c channels/features."""
    eps = data.draw(st.sampled_from([1e-5, 1e-3] * 3 + [0.0, -1.0]))
    affine = data.draw(st.booleans())
    n = data.draw(st.integers(1, 3))
    if kind == "batch":
        nd = data.draw(st.integers(1, 3))
        momentum = data.draw(st.sampled_from([0.1, None, 1.0, 0.0]))
        name = f"BatchNorm{nd}d"
        kw = dict(eps=eps, momentum=momentum, affine=affine,
                  track_running_stats=data.draw(st.sampled_from([True, True, False])))
        spatial = () if nd == 1 and data.draw(st.booleans()) else tuple(data.draw(st.integers(1, 3))
                                                                       for _ in range(max(nd, 1)))
        return name, (c,), kw, (n, c) + spatial
    if kind == "group":
        groups = data.draw(st.sampled_from([1, c, 0, c + 1] if c > 1 else [1, 2, 0]))
        return "GroupNorm", (groups, c), dict(eps=eps, affine=affine), (n, c, data.draw(st.integers(1, 3)))
    # One normalised value is 0 / 0 up to rounding (torch and treadle round differently): c >= 2 then.
    shape = (c,) if c > 1 and data.draw(st.booleans()) else (2, c)
    lead = (n,) + (data.draw(st.integers(1, 3)),) * data.draw(st.integers(0, 1))
    if kind == "layer":
        return "LayerNorm", (shape,), dict(eps=eps, elementwise_affine=affine), lead + shape
    return "RMSNorm", (shape,), dict(eps=data.draw(st.sampled_from([None, 1e-6, -1.0])),
                                     elementwise_affine=affine), lead + shape


@FUZZ
@given(kind=st.sampled_from(["batch", "group", "layer", "rms"]), c=st.integers(1, 4),
       dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_norm(kind, c, dtype, data):
    name, args, kw, shape = _norm_pair(kind, c, dtype, data)
    names = (name, "norm")
    net = _construct(lambda: getattr(tl.nn, name)(*args, dtype=dtype, **kw), names)
    if net is None:
        return
    ref = getattr(torch.nn, name)(*args, **kw)
    if kind == "batch":  # non-trivial running statistics for predict
        with torch.no_grad():
            if ref.running_mean is not None:
                ref.running_mean.normal_()
                ref.running_var.uniform_(0.5, 2.0)
    # torch's group norm refuses groups of one value (a guard for training; the result is the bias),
    # so those are compared at inference only.
    single = kind == "group" and args[1] // max(args[0], 1) * int(np.prod(shape[2:])) == 1
    _fuzz_layer(data, tl.nn.Sequential(net), ref, shape, dtype, names, step=not single,
                lenient=("more than 1 value per channel",))


# ---- embedding ----------------------------------------------------------------------------------------------

@FUZZ
@given(num=st.integers(1, 6), dim=st.integers(1, 4), dtype=st.sampled_from(FLOATS),
       index_dtype=st.sampled_from(["int64", "int64", "int32", "float32", "float64", "bool", "uint8"]),
       data=st.data())
def test_fuzz_embedding(num, dim, dtype, index_dtype, data):
    padding_idx = data.draw(st.sampled_from([None, None, 0, -1, num - 1, num, -num - 1]))
    names = ("Embedding", "embedding")
    net = _construct(lambda: tl.nn.Embedding(num, dim, padding_idx=padding_idx, dtype=dtype), names)
    if net is None:
        with pytest.raises(Exception):  # noqa: B017 (torch raises AssertionError here)
            torch.nn.Embedding(num, dim, padding_idx=padding_idx)
        return
    torch.manual_seed(0)
    ref = torch.nn.Embedding(num, dim, padding_idx=padding_idx)
    shape = tuple(data.draw(st.integers(0, 3)) for _ in range(data.draw(st.integers(1, 3))))
    ref, net = torch_pair(ref, tl.nn.Sequential(net), dtype, "0.")
    x = layout(_rng(data).integers(-2, num + 2, size=shape).astype(index_dtype), data.draw(st.sampled_from(LAYOUTS)))
    try:
        out = net.predict(x)
    except DOCUMENTED as e:
        expect_documented(e, names)
        if x.dtype.kind == "i" and x.size and x.flags.c_contiguous and x.shape[0]:
            bad = x[(x < 0) | (x >= num)]
            assert bad.size, f"valid indices {x} refused: {e}"
            assert str(bad[0]) in str(e), f"the message does not name the bad index {bad[0]}: {e}"
        return
    assert x.dtype.kind == "i" and ((x >= 0) & (x < num)).all(), f"indices {x} ({x.dtype}) accepted"
    assert_matches(out, ref(to_torch(x).long()), [], dtype, "Embedding")
    if x.size and data.draw(st.booleans()):
        check_step(net, ref, np.zeros(x.shape, np.int64), x, names, _rng(data), "0.")



# ---- upsampling, dropout, reshaping -------------------------------------------------------------------------

@FUZZ
@given(mode=st.sampled_from(["nearest", "bilinear"] * 3 + ["bicubic"]), dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_upsample(mode, dtype, data):
    by_size = data.draw(st.booleans())
    value = data.draw(st.sampled_from([1, 2, 3, 0, -1] if by_size else [2, 1.5, 0.7, 3.0, 0.0, -2.0, float("nan")]))
    value = value if data.draw(st.booleans()) else (value, data.draw(st.sampled_from([1, 2, 3])))
    kw = dict(size=value) if by_size else dict(scale_factor=value)
    kw["align_corners"] = data.draw(st.sampled_from([None, False, True])) if mode != "nearest" else None
    if not by_size and data.draw(st.booleans()):
        kw["recompute_scale_factor"] = True
    names = ("Upsample", "upsample")
    net = _construct(lambda: tl.nn.Upsample(mode=mode, **kw), names)
    if net is None:
        return
    ref = torch.nn.Upsample(mode=mode, **kw)
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(4))
    # A bilinear output on an input grid point has a zero-weight neighbour, which a NaN/Inf turns into
    # NaN; whether the point lands exactly on the grid or 1 ulp off depends on fused multiply-adds
    # (torch's float32 path fuses, its float64 path does not), so NaN positions are not compared there.
    _fuzz_layer(data, tl.nn.Sequential(net), ref, shape, dtype, names, step=False, nan_positions=mode == "nearest")


@FUZZ
@given(p=st.sampled_from([0.0, 0.3, 0.5, 1.0, -0.1, 1.5, float("nan")]), dtype=st.sampled_from(FLOATS),
       data=st.data())
def test_fuzz_dropout(p, dtype, data):
    """predict is the identity; a training forward keeps each element scaled by 1/(1-p) or zeroes it."""
    names = ("Dropout", "dropout")
    layer = _construct(lambda: tl.nn.Dropout(p), names)
    if layer is None:
        assert not 0 <= p <= 1, f"Dropout refused p={p}"  # (torch takes NaN)
        return
    net = tl.nn.Sequential(layer).to(dtype)
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(data.draw(st.integers(1, 3))))
    x = data.draw(near(shape, dtype))
    check_predict(net, torch.nn.Identity(), x, dtype, names)
    trainer = tl.Trainer(tl.nn.Sequential(tl.nn.Dropout(p)).to(dtype), tl.loss.MSE(), tl.optim.SGD(lr=0.1),
                         seed=data.draw(st.integers(0, 9)))
    try:
        out = trainer.forward(x)
    except DOCUMENTED as e:
        expect_documented(e, names)
        return
    # Each element is kept and scaled, or multiplied by 0 (so NaN/Inf inputs give NaN, as in torch).
    with np.errstate(all="ignore"):
        dropped = (x * 0).astype(dtype)
        scaled = (x / (1 - p)).astype(dtype) if p < 1 else dropped
    same = lambda a, b: (a == b) | (np.isnan(a) & np.isnan(b)) | np.isclose(a, b, rtol=TOL[dtype])  # noqa: E731
    assert (same(out, scaled) | same(out, dropped)).all(), f"dropout(p={p}) of {x} gave {out}"
    if p == 1.0:
        np.testing.assert_array_equal(out, dropped)


class _Reshape(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@FUZZ
@given(kind=st.sampled_from(["flatten", "unflatten", "identity"]), dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_reshaping_modules(kind, dtype, data):
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(data.draw(st.integers(1, 4))))
    dim = data.draw(st.integers(-5, 4))
    if kind == "flatten":
        args = (dim, data.draw(st.integers(-5, 4)))
        names, make = ("Flatten", "flatten"), lambda: tl.nn.Flatten(*args)
        ref = torch.nn.Flatten(*args)
    elif kind == "unflatten":
        size = tuple(data.draw(st.sampled_from([1, 2, 3, -1, 0])) for _ in range(data.draw(st.integers(1, 3))))
        names, make, ref = ("Unflatten", "reshape"), lambda: tl.nn.Unflatten(dim, size), torch.nn.Unflatten(dim, size)
    else:
        names, make, ref = ("Identity",), tl.nn.Identity, torch.nn.Identity()
    layer = _construct(make, names)
    if layer is None:
        return
    _fuzz_layer(data, tl.nn.Sequential(layer), ref, shape, dtype, names, step=False)



OUTPUT_ACTS = {"identity": lambda t: t, "softplus": torch.nn.functional.softplus, "sigmoid": torch.sigmoid,
               "tanh": torch.tanh}


class _TorchOutputTransform(torch.nn.Module):
    def __init__(self, scale, shift, acts):
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float64))
        self.register_buffer("shift", torch.tensor(shift, dtype=torch.float64))
        self.acts = acts

    def forward(self, x):
        cols = [OUTPUT_ACTS[self.acts[j if len(self.acts) > 1 else 0]](x[..., j]) for j in range(x.shape[-1])]
        return torch.stack(cols, dim=-1) * self.scale + self.shift


@FUZZ
@given(d=st.integers(1, 4), dtype=st.sampled_from(FLOATS), data=st.data())
def test_fuzz_output_transform(d, dtype, data):
    values = lambda: [data.draw(st.sampled_from([1.0, -2.0, 0.5, 0.0, 3.0, float("nan"), float("inf")]))  # noqa: E731
                      for _ in range(data.draw(st.sampled_from([1, d, d, d + 1])))]
    acts = [data.draw(st.sampled_from(sorted(OUTPUT_ACTS) * 3 + ["relu"]))
            for _ in range(data.draw(st.sampled_from([1, d, d, d + 1])))]
    scale, shift = values(), values()
    names = ("OutputTransform", "output_transform")
    layer = _construct(lambda: tl.nn.OutputTransform(scale, shift, acts, dtype=dtype), names)
    if layer is None:
        return
    shape = (data.draw(st.integers(1, 3)),) * data.draw(st.integers(1, 2)) + (d,)
    ref = _TorchOutputTransform(layer.scale.tolist(), layer.shift.tolist(), acts)  # as the layer stores them
    _fuzz_layer(data, tl.nn.Sequential(layer), ref, shape, dtype, names, step=False)

# ---- losses called directly ---------------------------------------------------------------------------------

LOSSES = {
    "mse": (lambda r, d: tl.loss.MSE(reduction=r), lambda p, t, r, d: torch.nn.functional.mse_loss(p, t, reduction=r)),
    "l1": (lambda r, d: tl.loss.L1(reduction=r), lambda p, t, r, d: torch.nn.functional.l1_loss(p, t, reduction=r)),
    "huber": (lambda r, d: tl.loss.Huber(delta=d, reduction=r),
              lambda p, t, r, d: torch.nn.functional.huber_loss(p, t, reduction=r, delta=d)),
    "ce": (lambda r, d: tl.loss.CrossEntropy(reduction=r),
           lambda p, t, r, d: torch.nn.functional.cross_entropy(p, t, reduction=r)),
    "bce": (lambda r, d: tl.loss.BCEWithLogits(reduction=r),
            lambda p, t, r, d: torch.nn.functional.binary_cross_entropy_with_logits(p, t, reduction=r)),
}


@FUZZ
@given(kind=st.sampled_from(sorted(LOSSES)), reduction=st.sampled_from(["mean", "sum", "mean", "sum", "none"]),
       delta=st.sampled_from([1.0, 0.5, 2.0, 0.0, -1.0, float("inf")]), dtype=st.sampled_from(FLOATS),
       data=st.data())
def test_fuzz_loss_call(kind, reduction, delta, dtype, data):
    """loss(pred, target) on numpy arrays against torch.nn.functional, and check_target's verdict."""
    make, reference = LOSSES[kind]
    names = ({"mse": "mse", "l1": "l1", "huber": "huber", "ce": "cross_entropy", "bce": "bce"}[kind], "loss")
    loss = _construct(lambda: make(reduction, delta), names)
    if loss is None:
        return
    shape = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))) + (data.draw(st.integers(1, 3)),) * \
        data.draw(st.integers(0, 1))
    pred = data.draw(near(shape, dtype))
    if kind == "ce":
        labels = shape[:1] + shape[2:]
        target = data.draw(near(labels, "int64", lo=shape[1]))
    else:
        target = data.draw(near(shape, dtype))
    try:
        loss.check_target(pred.shape, dtype, target)
        value = loss(pred, target)
    except DOCUMENTED as e:
        expect_documented(e, names + ("check_target", "target", "label"))
        return
    try:
        expected = reference(to_torch(pred), to_torch(target), reduction, delta)
    except Exception as e:  # noqa: BLE001 (any torch refusal)
        raise AssertionError(f"{names[0]} accepted {pred.shape} {pred.dtype} / {target.shape} {target.dtype} that "
                             f"torch refuses: {type(e).__name__}: {e}") from None
    assert_matches(np.asarray(value), expected, [pred, target], dtype, names[0])



# ---- regressions the fuzzing found ----------------------------------------------------------------------------

def test_adaptive_pool_refuses_negative_output_size():
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool1d: output_size must be positive \(or None\), got \(-1,\)"):
        tl.nn.AdaptiveAvgPool1d((-1,))
    with pytest.raises(ValueError, match="AdaptiveAvgPool2d: output_size"):
        tl.nn.AdaptiveAvgPool2d((2, -1))
    assert tl.nn.AdaptiveAvgPool2d((None, 2)).output_size == (None, 2)


def test_avg_pool_divisor_override_type():
    with pytest.raises(TypeError, match=r"AvgPool2d: divisor_override must be an int or None, got \(2, 2\)"):
        tl.nn.AvgPool2d(2, divisor_override=(2, 2))
    with pytest.raises(ValueError, match="AvgPool3d: divisor_override must be positive, got 0"):
        tl.nn.AvgPool3d(2, divisor_override=0)


def test_loss_call_takes_any_layout_and_names_bad_dtypes():
    pred = np.arange(12, dtype=np.float64).reshape(3, 4)
    target = np.ones((4, 3)).T  # Fortran order
    ro = pred.copy()
    ro.flags.writeable = False
    expected = torch.nn.functional.mse_loss(torch.tensor(pred), torch.tensor(target)).item()
    assert tl.loss.MSE()(pred[:, ::1].T.T, target) == pytest.approx(expected, rel=1e-12)
    assert tl.loss.MSE()(ro, target) == pytest.approx(expected, rel=1e-12)
    assert tl.loss.L1()(pred[:, ::2], target[:, ::2]) == pytest.approx(
        torch.nn.functional.l1_loss(torch.tensor(pred[:, ::2]), torch.tensor(target[:, ::2])).item(), rel=1e-12)
    with pytest.raises(TypeError, match="BCEWithLogits: target has unsupported dtype bool"):
        tl.loss.BCEWithLogits()(pred, pred > 3)


@pytest.mark.parametrize("dtype", FLOATS)
def test_bce_with_logits_infinite_logits_as_torch(dtype):
    x = np.array([np.inf, np.inf, -np.inf, -np.inf, 30.0], dtype)
    t = np.array([0.25, 1.0, 0.0, 0.5, 0.0], dtype)
    ours = tl.loss.BCEWithLogits(reduction="sum")
    for i in range(len(x)):
        ref = torch.nn.functional.binary_cross_entropy_with_logits(to_torch(x[i:i + 1]), to_torch(t[i:i + 1]),
                                                                   reduction="sum")
        np.testing.assert_array_equal(np.asarray(ours(x[i:i + 1], t[i:i + 1])), ref.numpy(), err_msg=f"{x[i]}, {t[i]}")
    assert np.isposinf(ours(x[:1], t[:1]))  # +inf logit, target < 1: an infinite loss, not NaN


class _Masked(tl.nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x, mask):
        return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]


def test_attention_names_wrong_dtypes():
    net = _Masked(tl.nn.MultiheadAttention(4, 2, batch_first=True))
    x = np.zeros((1, 3, 4), np.float32)
    with pytest.raises(TypeError, match="MultiheadAttention: attn_mask must be float32 .*additive.*, got int64"):
        net.predict([x, np.zeros((3, 3), np.int64)])
    with pytest.raises(TypeError, match="MultiheadAttention: query must be float32, got int32"):
        net.predict([np.zeros((1, 3, 4), np.int32), np.zeros((3, 3), np.float32)])
    with pytest.raises(ValueError, match="TransformerEncoderLayer: dim_feedforward must be positive, got 0"):
        tl.nn.TransformerEncoderLayer(4, 2, dim_feedforward=0)


def test_upsample_special_values_and_unchanged_sizes_as_torch():
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    x[0, 0, 1, 1] = np.inf
    x[0, 0, 2, 3] = np.nan
    cases = [dict(scale_factor=2, mode="nearest"), dict(scale_factor=(1.2, 2.0), mode="bilinear"),
             dict(scale_factor=1.2, mode="bilinear"), dict(size=(3, 1), mode="bilinear"),
             dict(size=(5, 4), mode="bilinear", align_corners=True)]
    for kw in cases:
        ours = tl.nn.Sequential(tl.nn.Upsample(**kw)).predict(x)
        ref = torch.nn.Upsample(**kw)(to_torch(x)).numpy()
        assert_matches(ours, ref, [x], "float32", str(kw))
    # nearest backward is a plain scatter: an infinite output gradient stays infinite
    (dx,) = tl._core.run_op("upsample2d", [np.ones((1, 1, 1, 1))], {"size": [2, 2], "mode": "nearest"},
                            [np.full((1, 1, 2, 2), np.inf)], "", True, 0)[1]
    assert np.isposinf(dx).all()


def test_upsample_refuses_empty_planes():
    with pytest.raises(ValueError, match=r"Upsample: input of shape \(1, 1, 0, 2\) has an empty spatial dimension"):
        tl.nn.Sequential(tl.nn.Upsample(size=(2, 2))).predict(np.zeros((1, 1, 0, 2), np.float32))
    with pytest.raises(ValueError, match="upsample2d: input of shape .* has an empty spatial dimension"):
        tl._core.run_op("upsample2d", [np.zeros((1, 1, 2, 0))], {"size": [2, 2], "mode": "nearest"}, None, "",
                        False, 0)


def test_batch_norm_with_batch_statistics_needs_positive_eps():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    trainer = tl.Trainer(tl.nn.Sequential(tl.nn.BatchNorm1d(3, eps=0.0)), tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    with pytest.raises(ValueError, match="BatchNorm1d: eps must be positive .* batch statistics, got 0"):
        trainer.step(x, x)
    assert trainer.steps == 0
    tl.nn.Sequential(tl.nn.BatchNorm1d(3, eps=0.0)).predict(x)  # running statistics: eps = 0 is torch's too
    with pytest.raises(ValueError, match="BatchNorm1d: eps must be positive"):
        tl.nn.Sequential(tl.nn.BatchNorm1d(3, eps=0.0, track_running_stats=False)).predict(x)


@pytest.mark.parametrize("layer", [lambda: tl.nn.Conv2d(1, 2, 3, padding=1), lambda: tl.nn.ConvTranspose2d(1, 2, 3),
                                   lambda: tl.nn.MaxPool2d(2, padding=1), lambda: tl.nn.AvgPool2d(2, padding=1)])
def test_conv_and_pool_refuse_empty_spatial_input(layer):
    """Padding alone once made an output (bias, or a -inf maximum) out of an empty input."""
    with pytest.raises(ValueError, match=r"2d: input \(1, 1, 3, 0\) has an empty spatial dimension"):
        tl.nn.Sequential(layer()).predict(np.zeros((1, 1, 3, 0), np.float32))
    for op, ins, attrs in (("conv", [np.zeros((1, 1, 3, 0)), np.ones((2, 1, 3, 3))], {"padding": [1, 1]}),
                           ("max_pool", [np.zeros((1, 1, 3, 0))], {"kernel_size": [2, 2], "padding": [1, 1]})):
        with pytest.raises(ValueError, match="has an empty spatial dimension"):
            tl._core.run_op(op, ins, attrs, None, "", False, 0)
