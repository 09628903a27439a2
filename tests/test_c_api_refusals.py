"""The C API under misuse: every bad call returns its status with a message naming the problem, never
crashes, and leaves the model and trainer as they were (the next step equals an untouched twin's).

The calls go through ctypes into the libtreadle the imported Python module itself links, in a child
process (a crash there fails one test instead of the run). Each case prints one JSON line."""
import json
import subprocess
import sys
import textwrap

import pytest

OK, VALUE, TYPE, IO, ARGUMENT = 0, 1, 2, 3, 4

_CHILD = textwrap.dedent(r"""
    import ctypes, json, os, sys
    import numpy as np
    import treadle  # loads libtreadle: the C API is the same library

    path = next(line.split()[-1] for line in open("/proc/self/maps") if "/libtreadle.so" in line)
    lib = ctypes.CDLL(path)
    lib.treadle_last_error.restype = ctypes.c_char_p
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    MODEL = json.dumps({"type": "Sequential", "layers": [
        {"type": "Linear", "config": {"in_features": 3, "out_features": 8}}, {"type": "Tanh"},
        {"type": "Linear", "config": {"in_features": 8, "out_features": 2}}]}).encode()
    X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    Y = np.ones((4, 2), np.float32)
    LABELS = np.array([0, 1, 1, 0], np.int64)

    def shape(*dims):
        return (I64 * max(len(dims), 1))(*dims)

    def ptr(a):
        return a.ctypes.data_as(P)

    def make(loss=b"mse", options=b'{"lr": 0.01}'):
        m, t = P(), P()
        assert lib.treadle_model_from_json(MODEL, 0, ctypes.c_uint64(3), ctypes.byref(m)) == 0
        assert lib.treadle_trainer_create(m, loss, b"adam", options, ctypes.c_uint64(0), ctypes.byref(t)) == 0, \
            lib.treadle_last_error()
        target = LABELS if loss == b"cross_entropy" else Y
        assert lib.treadle_trainer_step(t, ptr(X), 2, shape(4, 3), ptr(target), target.ndim, shape(*target.shape),
                                        None) == 0
        return m, t

    def params(m):
        n = I64()
        assert lib.treadle_model_num_parameters(m, ctypes.byref(n)) == 0
        out = np.empty(n.value, np.float32)
        assert lib.treadle_model_get_parameters(m, ptr(out), n.value) == 0
        return out

    def step(t, loss):
        value = ctypes.c_double()
        target = LABELS if loss == b"cross_entropy" else Y
        assert lib.treadle_trainer_step(t, ptr(X), 2, shape(4, 3), ptr(target), target.ndim, shape(*target.shape),
                                        ctypes.byref(value)) == 0, lib.treadle_last_error()
        return value.value

    fifo = os.path.join(sys.argv[1], "fifo.safetensors")
    os.mkfifo(fifo)
    garbage = os.path.join(sys.argv[1], "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\xff" * 8 + b"{not json")
    huge_header = os.path.join(sys.argv[1], "huge.safetensors")
    with open(huge_header, "wb") as f:
        f.write((2 ** 62).to_bytes(8, "little") + b"{}")
    nested = b"[" * 100000 + b"]" * 100000
    big = json.dumps({"type": "Linear", "config": {"in_features": 2 ** 40, "out_features": 2 ** 40}}).encode()
    negative = json.dumps({"type": "Linear", "config": {"in_features": -3, "out_features": 2}}).encode()
    out_buf = np.empty(64, np.float32)
    nan_x = X.copy(); nan_x[0, 0] = np.nan
    out_ndim = ctypes.c_int()

    CASES = {
        # models
        "from_json NULL json": lambda m, t: lib.treadle_model_from_json(None, 0, ctypes.c_uint64(0), ctypes.byref(P())),
        "from_json NULL out": lambda m, t: lib.treadle_model_from_json(MODEL, 0, ctypes.c_uint64(0), None),
        "from_json garbage": lambda m, t: lib.treadle_model_from_json(b"{]", 0, ctypes.c_uint64(0), ctypes.byref(P())),
        "from_json nested 100000 deep": lambda m, t: lib.treadle_model_from_json(nested, 0, ctypes.c_uint64(0),
                                                                                  ctypes.byref(P())),
        "from_json huge Linear": lambda m, t: lib.treadle_model_from_json(big, 0, ctypes.c_uint64(0), ctypes.byref(P())),
        "from_json negative size": lambda m, t: lib.treadle_model_from_json(negative, 0, ctypes.c_uint64(0),
                                                                             ctypes.byref(P())),
        "from_json unknown dtype": lambda m, t: lib.treadle_model_from_json(MODEL, 7, ctypes.c_uint64(0),
                                                                             ctypes.byref(P())),
        "load FIFO": lambda m, t: lib.treadle_model_load(fifo.encode(), ctypes.byref(P())),
        "load directory": lambda m, t: lib.treadle_model_load(sys.argv[1].encode(), ctypes.byref(P())),
        "load missing": lambda m, t: lib.treadle_model_load(b"/nonexistent/x.safetensors", ctypes.byref(P())),
        "load garbage": lambda m, t: lib.treadle_model_load(garbage.encode(), ctypes.byref(P())),
        "load 2^62-byte header": lambda m, t: lib.treadle_model_load(huge_header.encode(), ctypes.byref(P())),
        "load_weights garbage": lambda m, t: lib.treadle_model_load_weights(m, garbage.encode()),
        "save into a missing directory": lambda m, t: lib.treadle_model_save(m, b"/nonexistent/dir/x.safetensors"),
        "get_parameters too small": lambda m, t: lib.treadle_model_get_parameters(m, ptr(out_buf), 3),
        "get_parameters NULL": lambda m, t: lib.treadle_model_get_parameters(m, None, 10 ** 6),
        "set_parameters wrong count": lambda m, t: lib.treadle_model_set_parameters(m, ptr(out_buf), 3),
        "set_parameters NULL": lambda m, t: lib.treadle_model_set_parameters(m, None, params(m).size),
        "set_backend unknown": lambda m, t: lib.treadle_model_set_backend(m, b"tpu"),
        "set_backend NULL": lambda m, t: lib.treadle_model_set_backend(m, None),
        "set_precision unknown": lambda m, t: lib.treadle_model_set_precision(m, b"fp8"),
        "output_shape negative ndim": lambda m, t: lib.treadle_model_output_shape(m, -1, shape(4, 3), 4,
                                                                                   ctypes.byref(out_ndim), shape(0, 0)),
        "output_shape ndim 1000": lambda m, t: lib.treadle_model_output_shape(m, 1000, shape(4, 3), 4,
                                                                               ctypes.byref(out_ndim), shape(0, 0)),
        "output_shape capacity -1": lambda m, t: lib.treadle_model_output_shape(m, 2, shape(4, 3), -1,
                                                                                 ctypes.byref(out_ndim), shape(0, 0)),
        "output_shape overflowing dims": lambda m, t: lib.treadle_model_output_shape(
            m, 2, shape(2 ** 62, 2 ** 62), 4, ctypes.byref(out_ndim), shape(0, 0)),
        "predict wrong width": lambda m, t: lib.treadle_model_predict(m, ptr(X), 2, shape(3, 4), ptr(out_buf), 64),
        "predict y too small": lambda m, t: lib.treadle_model_predict(m, ptr(X), 2, shape(4, 3), ptr(out_buf), 7),
        "predict NULL x": lambda m, t: lib.treadle_model_predict(m, None, 2, shape(4, 3), ptr(out_buf), 64),
        "predict NULL shape": lambda m, t: lib.treadle_model_predict(m, ptr(X), 2, None, ptr(out_buf), 64),
        "predict negative dim": lambda m, t: lib.treadle_model_predict(m, ptr(X), 2, shape(-4, 3), ptr(out_buf), 64),
        "predict NULL model": lambda m, t: lib.treadle_model_predict(None, ptr(X), 2, shape(4, 3), ptr(out_buf), 64),
        # trainers
        "trainer unknown loss": lambda m, t: lib.treadle_trainer_create(m, b"hinge", b"adam", None, ctypes.c_uint64(0),
                                                                         ctypes.byref(P())),
        "trainer unknown optimizer": lambda m, t: lib.treadle_trainer_create(m, b"mse", b"lion", None,
                                                                              ctypes.c_uint64(0), ctypes.byref(P())),
        "trainer infinite lr": lambda m, t: lib.treadle_trainer_create(m, b"mse", b"adam", b'{"lr": 1e999}',
                                                                        ctypes.c_uint64(0), ctypes.byref(P())),
        "trainer 2^64 momentum": lambda m, t: lib.treadle_trainer_create(
            m, b"mse", b"sgd", b'{"momentum": 1e400}', ctypes.c_uint64(0), ctypes.byref(P())),
        "from_json 2^64 in_features": lambda m, t: lib.treadle_model_from_json(
            b'{"type": "Linear", "config": {"in_features": 18446744073709551616, "out_features": 2}}', 0,
            ctypes.c_uint64(0), ctypes.byref(P())),
        "trainer negative lr": lambda m, t: lib.treadle_trainer_create(m, b"mse", b"sgd", b'{"lr": -1}',
                                                                        ctypes.c_uint64(0), ctypes.byref(P())),
        "trainer unknown option": lambda m, t: lib.treadle_trainer_create(m, b"mse", b"sgd", b'{"lr": 0.1, "lrr": 1}',
                                                                           ctypes.c_uint64(0), ctypes.byref(P())),
        "trainer options not JSON": lambda m, t: lib.treadle_trainer_create(m, b"mse", b"sgd", b'{lr: 0.1',
                                                                             ctypes.c_uint64(0), ctypes.byref(P())),
        "step NULL trainer": lambda m, t: lib.treadle_trainer_step(None, ptr(X), 2, shape(4, 3), ptr(Y), 2,
                                                                    shape(4, 2), None),
        "step unpaired target": lambda m, t: lib.treadle_trainer_step(t, ptr(X), 2, shape(4, 3), ptr(Y), 2,
                                                                       shape(3, 2), None),
        "step wrong target width": lambda m, t: lib.treadle_trainer_step(t, ptr(X), 2, shape(4, 3), ptr(Y), 2,
                                                                          shape(2, 4), None),
        "step NULL target": lambda m, t: lib.treadle_trainer_step(t, ptr(X), 2, shape(4, 3), None, 2, shape(4, 2),
                                                                   None),
        "step empty batch": lambda m, t: lib.treadle_trainer_step(t, ptr(X), 2, shape(0, 3), ptr(Y), 2, shape(0, 2),
                                                                   None),
        "backward before forward": lambda m, t: lib.treadle_trainer_backward(t, ptr(Y), 2, shape(4, 2)),
        "forward out too small": lambda m, t: lib.treadle_trainer_forward(t, ptr(X), 2, shape(4, 3), ptr(out_buf), 3),
        "gradients too small": lambda m, t: lib.treadle_trainer_get_gradients(t, ptr(out_buf), 3),
    }
    CE_CASES = {
        "cross_entropy label out of range": lambda m, t: lib.treadle_trainer_step(
            t, ptr(X), 2, shape(4, 3), ptr(np.array([0, 5, 1, 0], np.int64)), 1, shape(4), None),
        "cross_entropy negative label": lambda m, t: lib.treadle_trainer_step(
            t, ptr(X), 2, shape(4, 3), ptr(np.array([0, -1, 1, 0], np.int64)), 1, shape(4), None),
    }

    for cases, loss in ((CASES, b"mse"), (CE_CASES, b"cross_entropy")):
        for name, call in cases.items():
            m, t = make(loss)
            twin_m, twin_t = make(loss)
            before = params(m)
            status = call(m, t)
            message = lib.treadle_last_error().decode()
            unchanged = bool(np.array_equal(params(m), before))
            same_next_step = step(t, loss) == step(twin_t, loss) and bool(np.array_equal(params(m), params(twin_m)))
            for h in (t, twin_t):
                lib.treadle_trainer_free(h)
            for h in (m, twin_m):
                lib.treadle_model_free(h)
            print(json.dumps({"case": name, "status": status, "message": message, "unchanged": unchanged,
                              "same_next_step": same_next_step}), flush=True)
    print("done", flush=True)
""")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path_factory.mktemp("c_api"))],
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("done"), (
        f"the child ended with {proc.returncode} after {lines[-1]['case'] if lines else 'no case'}:\n"
        f"{proc.stderr[-3000:]}")
    return {r["case"]: r for r in lines}


# case: (status, a fragment of the message)
EXPECTED = {
    "from_json NULL json": (ARGUMENT, "json is NULL"),
    "from_json NULL out": (ARGUMENT, "out is NULL"),
    "from_json garbage": (VALUE, ""),
    "from_json nested 100000 deep": (VALUE, "nesting deeper"),
    "from_json huge Linear": (VALUE, "model (Linear): "),
    "from_json negative size": (VALUE, "Linear"),
    "from_json unknown dtype": (ARGUMENT, "dtype"),
    "load FIFO": (VALUE, "not a regular file"),
    "load directory": (VALUE, "not a regular file"),
    "load missing": (IO, ""),
    "load garbage": (VALUE, ""),
    "load 2^62-byte header": (VALUE, "header"),
    "load_weights garbage": (VALUE, ""),
    "save into a missing directory": (IO, ""),
    "get_parameters too small": (ARGUMENT, "buffer holds 3 values"),
    "get_parameters NULL": (ARGUMENT, "buffer is NULL"),
    "set_parameters wrong count": (ARGUMENT, "count is 3"),
    "set_parameters NULL": (ARGUMENT, "buffer is NULL"),
    "set_backend unknown": (VALUE, "tpu"),
    "set_backend NULL": (ARGUMENT, "backend is NULL"),
    "set_precision unknown": (VALUE, "fp8"),
    "output_shape negative ndim": (ARGUMENT, "ndim"),
    "output_shape ndim 1000": (ARGUMENT, "ndim"),
    "output_shape capacity -1": (ARGUMENT, "out_shape"),
    "output_shape overflowing dims": (VALUE, "overflow"),
    "predict wrong width": (VALUE, ""),
    "predict y too small": (ARGUMENT, "y holds 7 values"),
    "predict NULL x": (ARGUMENT, "x is NULL"),
    "predict NULL shape": (ARGUMENT, "shape is NULL"),
    "predict negative dim": (ARGUMENT, "negative dimension"),
    "predict NULL model": (ARGUMENT, "model is NULL"),
    "trainer unknown loss": (VALUE, "hinge"),
    "trainer unknown optimizer": (VALUE, "lion"),
    "trainer infinite lr": (VALUE, "lr is 1e999, outside the range of a finite double"),
    "trainer negative lr": (VALUE, "lr"),
    "trainer 2^64 momentum": (VALUE, "momentum is 1e400, outside the range"),
    "from_json 2^64 in_features": (VALUE, "in_features is 18446744073709551616, outside the range"),
    "trainer unknown option": (VALUE, "lrr"),
    "trainer options not JSON": (VALUE, ""),
    "step NULL trainer": (ARGUMENT, "trainer is NULL"),
    "step unpaired target": (VALUE, ""),
    "step wrong target width": (VALUE, ""),
    "step NULL target": (ARGUMENT, "y is NULL"),
    "step empty batch": (VALUE, ""),
    "backward before forward": (None, ""),
    "forward out too small": (ARGUMENT, "out holds 3 values"),
    "gradients too small": (ARGUMENT, "buffer holds 3 values"),
    "cross_entropy label out of range": (VALUE, "5"),
    "cross_entropy negative label": (VALUE, "-1"),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_bad_c_call_is_refused_cleanly(results, case):
    r = results[case]
    status, fragment = EXPECTED[case]
    assert r["status"] != OK, r
    if status is not None:
        assert r["status"] == status, r
    assert r["message"] and fragment in r["message"], r
    assert r["unchanged"] and r["same_next_step"], r


def test_every_case_ran(results):
    assert sorted(results) == sorted(EXPECTED)
