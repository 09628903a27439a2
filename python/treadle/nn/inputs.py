"""Input forms beyond arrays: nested lists of numbers (data, copied once) and nested tuples of arrays
(a forward's structured arguments, as in torch's forward(input, (h, c)))."""
import numpy as np


def _is_list_data(a):
    """A nested list or tuple of numbers: data to copy into an array (a list of arrays is several inputs)."""
    return isinstance(a, (list, tuple)) and bool(a) and not any(
        isinstance(v, np.ndarray) or hasattr(v, "__array_interface__") or hasattr(v, "detach") for v in a)


def _list_data(a, dtype, what):
    """A nested list of numbers as an array (one documented copy): floats in the model's dtype, integers
    (labels, indices) int64."""
    try:
        array = np.asarray(a)
    except ValueError as e:  # ragged
        raise ValueError(f"{what}: a list input must be a rectangular nested list of numbers ({e})") from None
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(f"{what}: a list input must be a rectangular nested list of numbers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=dtype if array.dtype.kind in "fb" else np.int64)


def _is_array(v):
    return isinstance(v, np.ndarray) or hasattr(v, "__array_interface__") or hasattr(v, "detach")


def _nested_inputs(x):
    """A list of inputs one of which is itself a tuple or list of arrays: forward(data, (h, c))."""
    return any(isinstance(v, (list, tuple)) and v and all(_is_array(e) or _nested_inputs([e]) for e in v)
               for v in x)


def _flatten_inputs(x):
    """(the arrays in order, the nesting as the same structure with None leaves)."""
    flat = []

    def walk(v):
        if isinstance(v, (list, tuple)):
            return tuple(walk(e) for e in v)
        flat.append(v)
        return None

    return flat, walk(x)


def _unflatten_inputs(flat, structure):
    """The forward's arguments: `flat` as is, or rebuilt into `structure` (a tuple of None leaves and
    tuples)."""
    if structure is None:
        return list(flat)
    leaves = iter(flat)

    def build(node):
        return next(leaves) if node is None else tuple(build(n) for n in node)

    return list(build(structure))
