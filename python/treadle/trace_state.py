"""What a trace on this thread knows: the graph being recorded, the module names under its root, the
dtype of the constants a forward creates, and the nesting of structured inputs (see
nn.Module.__call__ and nn.Module._compiled). The modules, the tensor factories and the functional ops
read it; it imports none of them, so each can import it.
"""
import threading

# The graph being traced on this thread and the module names under its root (see Module.__call__).
_tracing = threading.local()


def _dtype_name(dtype, owner):
    """torch.float64 -> "float64"; names and numpy dtypes pass through (the core checks them)."""
    text = str(dtype)
    if text.startswith("torch."):
        name = text[len("torch."):]
        if name not in ("float32", "float64"):
            raise TypeError(f"{owner}: dtype must be float32 or float64, got {text}")
        return name
    return dtype
