"""Every module of tl.nn, constructed with absurd sizes (past any machine's memory, negative, zero,
int64's limit) in its integer arguments, and, where that is accepted, run on small inputs of every
rank: each call either works or raises a Python exception. A crash (an overflowed size reaching an
allocation or a loop bound) ends the child process, which fails the test with the case that did it.

The catalog is read from tl.nn itself, so a new module is fuzzed without being listed here."""
import subprocess
import sys
import textwrap

import pytest

from conftest import UNDER_ASAN

_CHILD = textwrap.dedent(r"""
    import inspect, random, sys
    import numpy as np
    import treadle as tl

    rng = random.Random(int(sys.argv[1]))
    ABSURD = [2 ** 40, 2 ** 46, 2 ** 52, 2 ** 62, 2 ** 63 - 1, -1, -(2 ** 40), 0]
    SANE = [1, 2, 3]
    # arguments that are sizes, counts, lengths or indices (the rest keep their defaults)
    SIZE_WORDS = ("size", "features", "channels", "kernel", "stride", "padding", "dilation", "groups", "num_",
                  "dim", "embed", "hidden", "d_model", "nhead", "normalized_shape", "heads", "layers",
                  "scale_factor", "padding_idx", "output_padding", "divisor")
    SKIP = {"Module", "Sequential", "_NativeModule"}

    def catalog():
        for name in sorted(dir(tl.nn)):
            cls = getattr(tl.nn, name)
            if inspect.isclass(cls) and issubclass(cls, tl.nn.Module) and name not in SKIP:
                yield name, cls

    def size_params(cls):
        try:
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            return [], []
        sized = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD and any(w in p.name for w in SIZE_WORDS)]
        required = [p.name for p in sized if p.default is inspect.Parameter.empty]
        optional = [p.name for p in sized if p.default is not inspect.Parameter.empty]
        return required, optional

    def value(absurd):
        v = rng.choice(ABSURD if absurd else SANE)
        return (v, rng.choice(SANE)) if rng.random() < 0.2 else v  # sometimes a tuple, as kernel sizes may be

    def inputs():
        for rank in (2, 3, 4, 5):
            yield np.ones(tuple(rng.choice([1, 2, 3]) for _ in range(rank)), np.float32)
        yield np.zeros((2, 3), np.int64)  # indices, for Embedding

    def check_against_torch(name, kwargs, module, x, y):
        # A parameter-free module that accepted an absurd size must still give torch's answer, or torch
        # must accept it too: an overflowed size that happens to "fit" gives a silently wrong output.
        if module.num_parameters() or not hasattr(torch.nn, name):
            return
        try:
            expected = getattr(torch.nn, name)(**kwargs)(torch.from_numpy(x)).numpy()
        except Exception as e:
            mismatches.append(f"{name}({kwargs}) on {x.shape}: treadle gave {np.shape(y)}, torch refused: {e}")
            return
        if np.shape(y) != expected.shape or not np.allclose(y, expected, rtol=1e-5, atol=1e-6):
            mismatches.append(f"{name}({kwargs}) on {x.shape}: treadle {np.shape(y)}, torch {expected.shape}")

    import torch
    mismatches = []
    cases = accepted = 0
    for name, cls in catalog():
        required, optional = size_params(cls)
        if not required and not optional:
            continue
        for trial in range(6):
            kwargs = {p: value(True) for p in required}
            for p in optional:
                if rng.random() < 0.4:
                    kwargs[p] = value(rng.random() < 0.7)
            if not any(isinstance(v, int) and v in ABSURD or isinstance(v, tuple) and v[0] in ABSURD
                       for v in kwargs.values()):
                kwargs[(required or optional)[0]] = rng.choice(ABSURD)
            cases += 1
            print(f"case {name}({kwargs})", flush=True)  # the last line names the crash, if any
            try:
                module = cls(**kwargs)
            except (ValueError, TypeError, OverflowError, NotImplementedError):
                continue
            accepted += 1
            for x in inputs():
                try:
                    y = module.predict(x)
                except (ValueError, TypeError, OverflowError, NotImplementedError, RuntimeError, MemoryError):
                    continue
                print(f"  ran on {x.shape} {x.dtype}: output {np.shape(y)}", flush=True)
                check_against_torch(name, kwargs, module, x, y)
    for m in mismatches:
        print("mismatch", m, flush=True)
    print(f"done {cases} cases, {accepted} accepted, {len(mismatches)} mismatches", flush=True)
""")


@pytest.mark.parametrize("seed", range(1 if UNDER_ASAN else 4))
def test_absurd_sizes_in_every_module_never_crash(seed):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(seed)], capture_output=True, text=True, timeout=600)
    last = [line for line in proc.stdout.splitlines() if line.startswith("case ")][-1:] or ["before the first case"]
    assert proc.returncode == 0 and "done" in proc.stdout, (
        f"rc {proc.returncode} at {last[0]}\n{proc.stderr[-3000:]}")
    mismatches = [line for line in proc.stdout.splitlines() if line.startswith("mismatch")]
    assert not mismatches, "\n".join(mismatches)
