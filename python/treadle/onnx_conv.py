"""ONNX exporters for the convolution and pooling layers (registered into tl.io's exporter table)."""
import numpy as np

from . import io


def _tuple(v, nd):
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * nd


def _spatial(shape, layer):
    if any(d is None for d in shape[2:]):
        raise ValueError(f"export_onnx: {layer} needs fixed spatial sizes; give input_shape")
    return shape[2:]


def _window_out(size, k, s, pb, pe, d, ceil_mode=False):
    span = size + pb + pe - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + pb:  # torch: the last window must start inside the input
        out -= 1
    return out


def _conv(g, m, cfg, x, shape):
    nd = len(shape) - 2
    if cfg.get("padding_mode", "zeros") != "zeros":
        raise NotImplementedError(f"ONNX export: Conv with padding_mode={cfg['padding_mode']!r} is not supported "
                                  "(only 'zeros')")
    k, s, d = _tuple(cfg["kernel_size"], nd), _tuple(cfg["stride"], nd), _tuple(cfg["dilation"], nd)
    if cfg["padding"] == "valid":
        begin = end = [0] * nd
    elif cfg["padding"] == "same":
        total = [di * (ki - 1) for ki, di in zip(k, d)]
        begin = [t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    else:
        begin = end = _tuple(cfg["padding"], nd)
    params = dict(m.named_parameter_objects())
    inputs = [x, g.const(np.array(params["weight"].data), "weight")]
    if "bias" in params:
        inputs.append(g.const(np.array(params["bias"].data), "bias"))
    y = g.op("Conv", inputs, kernel_shape=k, strides=s, dilations=d, pads=begin + end, group=int(cfg["groups"]))
    out = [_window_out(n, ki, si, pb, pe, di) for n, ki, si, pb, pe, di in
           zip(_spatial(shape, "Conv"), k, s, begin, end, d)]
    return y, [shape[0], int(cfg["out_channels"])] + out


def _conv_transpose(g, m, cfg, x, shape):
    nd = len(shape) - 2
    k, s, p, op, d = (_tuple(cfg[n], nd) for n in ("kernel_size", "stride", "padding", "output_padding", "dilation"))
    params = dict(m.named_parameter_objects())
    inputs = [x, g.const(np.array(params["weight"].data), "weight")]
    if "bias" in params:
        inputs.append(g.const(np.array(params["bias"].data), "bias"))
    y = g.op("ConvTranspose", inputs, kernel_shape=k, strides=s, dilations=d, pads=p + p, output_padding=op,
             group=int(cfg["groups"]))
    out = [(n - 1) * si - 2 * pi + di * (ki - 1) + opi + 1
           for n, ki, si, pi, opi, di in zip(_spatial(shape, "ConvTranspose"), k, s, p, op, d)]
    return y, [shape[0], int(cfg["out_channels"])] + out


def _pool(op_type):
    def fn(g, m, cfg, x, shape):
        nd = len(shape) - 2
        k = _tuple(cfg["kernel_size"], nd)
        s = _tuple(cfg["stride"] if cfg.get("stride") else cfg["kernel_size"], nd)
        p = _tuple(cfg["padding"], nd)
        ceil = bool(cfg.get("ceil_mode", False))
        attrs = dict(kernel_shape=k, strides=s, pads=p + p, ceil_mode=int(ceil))
        d = [1] * nd
        if op_type == "MaxPool":
            d = _tuple(cfg.get("dilation", 1), nd)
            attrs["dilations"] = d
        else:
            if cfg.get("divisor_override") is not None:
                raise ValueError("export_onnx: AvgPool with divisor_override has no ONNX equivalent")
            attrs["count_include_pad"] = int(cfg.get("count_include_pad", True))
        out = [_window_out(n, ki, si, pi, pi, di, ceil)
               for n, ki, si, pi, di in zip(_spatial(shape, op_type), k, s, p, d)]
        return g.op(op_type, [x], **attrs), shape[:2] + out
    return fn


def _adaptive_avg(g, m, cfg, x, shape):
    nd = len(shape) - 2
    size = cfg["output_size"]
    if any(v != 1 for v in _tuple(size, nd)):
        raise ValueError("export_onnx: AdaptiveAvgPool exports only with output_size 1 (global average)")
    return g.op("GlobalAveragePool", [x]), shape[:2] + [1] * nd


def _global_avg_2d(g, m, cfg, x, shape):
    return g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1), shape[:2]


for _d in (1, 2, 3):
    io.register_onnx(f"Conv{_d}d", _conv)
    io.register_onnx(f"ConvTranspose{_d}d", _conv_transpose)
    io.register_onnx(f"MaxPool{_d}d", _pool("MaxPool"))
    io.register_onnx(f"AvgPool{_d}d", _pool("AveragePool"))
    io.register_onnx(f"AdaptiveAvgPool{_d}d", _adaptive_avg)
io.register_onnx("GlobalAvgPool2d", _global_avg_2d)
