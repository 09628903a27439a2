"""Replay buffers and checkpoints through the C API (treadle.h), called with ctypes in a child process:
push and sample with caller memory, the watermark and bad arguments by status and message, and a
training run that samples from a buffer resumed bit for bit from treadle_trainer_save_checkpoint."""
import json
import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(r"""
    import ctypes, json, sys
    import numpy as np
    import treadle  # loads libtreadle: the C API is the same library

    path = next(line.split()[-1] for line in open("/proc/self/maps") if "/libtreadle.so" in line)
    lib = ctypes.CDLL(path)
    lib.treadle_last_error.restype = ctypes.c_char_p
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    report = {}

    def buffer(policy=b"firo", capacity=32, min_size=4, seed=5):
        names = (ctypes.c_char_p * 2)(b"x", b"y")
        ndims = (ctypes.c_int * 2)(1, 1)
        shapes = (I64 * 2)(1, 1)
        dtypes = (ctypes.c_int * 2)(1, 1)  # TREADLE_F64
        out = P()
        rc = lib.treadle_replay_create(policy, I64(capacity), I64(min_size), I64(-1), ctypes.c_uint64(seed), 2, names,
                                       ndims, shapes, dtypes, ctypes.byref(out))
        assert rc == 0, lib.treadle_last_error()
        return out

    def ptrs(*arrays):
        return (P * len(arrays))(*[a.ctypes.data for a in arrays])

    b = buffer()
    x = np.linspace(-1, 1, 6).reshape(6, 1)
    report["push"] = lib.treadle_replay_push(b, I64(6), ptrs(x, np.sin(x)))
    size, ready = I64(), ctypes.c_int()
    lib.treadle_replay_size(b, ctypes.byref(size))
    lib.treadle_replay_ready(b, I64(4), ctypes.byref(ready))
    report["size"], report["ready"] = size.value, ready.value
    bx, by = np.zeros((4, 1)), np.zeros((4, 1))
    report["sample"] = lib.treadle_replay_sample(b, I64(4), ptrs(bx, by))
    report["sampled_pairs_match"] = bool(np.allclose(np.sin(bx), by)) and len(set(bx.ravel())) == 4
    report["below"] = [lib.treadle_replay_sample(b, I64(4), ptrs(bx, by)), lib.treadle_last_error().decode()]
    report["null"] = [lib.treadle_replay_push(b, I64(2), None), lib.treadle_last_error().decode()]
    bad = P()
    names = (ctypes.c_char_p * 1)(b"x")
    report["bad_dtype"] = [lib.treadle_replay_create(b"firo", I64(4), I64(0), I64(-1), ctypes.c_uint64(0), 1, names,
                                                     (ctypes.c_int * 1)(0), None, (ctypes.c_int * 1)(7), ctypes.byref(bad)),
                           lib.treadle_last_error().decode()]
    report["bad_policy"] = [lib.treadle_replay_create(b"lifo", I64(4), I64(0), I64(-1), ctypes.c_uint64(0), 1, names,
                                                      (ctypes.c_int * 1)(0), None, (ctypes.c_int * 1)(0), ctypes.byref(bad)),
                            lib.treadle_last_error().decode()]
    lib.treadle_replay_free(b)

    MODEL = json.dumps({"type": "Sequential", "layers": [
        {"type": "Linear", "config": {"in_features": 1, "out_features": 8}}, {"type": "Tanh"},
        {"type": "Linear", "config": {"in_features": 8, "out_features": 1}}]}).encode()

    def run(steps, save_at=None, resume=False):
        m, t = P(), P()
        assert lib.treadle_model_from_json(MODEL, 1, ctypes.c_uint64(3), ctypes.byref(m)) == 0
        assert lib.treadle_trainer_create(m, b"mse", b"adam", b'{"lr": 0.01}', ctypes.c_uint64(0), ctypes.byref(t)) == 0
        buf = buffer(b"reservoir", 16, 8, 9)
        names = (ctypes.c_char_p * 1)(b"sim")
        bufs = (P * 1)(buf)
        start = 0
        if resume:
            assert lib.treadle_trainer_load_checkpoint(t, sys.argv[1].encode(), 1, names, bufs) == 0, \
                lib.treadle_last_error()
            start = save_at
        bx, by = np.zeros((8, 1)), np.zeros((8, 1))
        shape = (I64 * 2)(8, 1)
        loss = ctypes.c_double()
        for step in range(start, steps):
            x = np.linspace(-2, 2, 4).reshape(4, 1) + 0.1 * step
            assert lib.treadle_replay_push(buf, I64(4), ptrs(x, np.sin(x))) == 0
            ok = ctypes.c_int()
            lib.treadle_replay_ready(buf, I64(8), ctypes.byref(ok))
            if ok.value:
                assert lib.treadle_replay_sample(buf, I64(8), ptrs(bx, by)) == 0
                assert lib.treadle_trainer_step(t, bx.ctypes.data_as(P), 2, shape, by.ctypes.data_as(P), 2, shape,
                                                ctypes.byref(loss)) == 0, lib.treadle_last_error()
            if save_at is not None and not resume and step + 1 == save_at:
                assert lib.treadle_trainer_save_checkpoint(t, sys.argv[1].encode(), 1, names, bufs) == 0, \
                    lib.treadle_last_error()
        n = I64()
        lib.treadle_model_num_parameters(m, ctypes.byref(n))
        params = np.zeros(n.value)
        lib.treadle_model_get_parameters(m, params.ctypes.data_as(P), n)
        lib.treadle_trainer_free(t); lib.treadle_model_free(m); lib.treadle_replay_free(buf)
        return params

    whole = run(10, save_at=4)
    resumed = run(10, save_at=4, resume=True)
    report["resumed_bitwise"] = bool(np.array_equal(whole, resumed))
    report["trained"] = bool(np.abs(whole).sum() > 0)
    print(json.dumps(report))
""")


def test_replay_buffers_and_checkpoints_from_c(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "ckpt.treadle")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (r["push"], r["size"], r["ready"], r["sample"]) == (0, 6, 1, 0)
    assert r["sampled_pairs_match"]
    assert r["below"][0] == 1 and "2 samples held, 4 needed" in r["below"][1]
    assert r["null"] == [4, "treadle_replay_push: fields is NULL"]
    assert r["bad_dtype"][0] == 4 and "dtype must be TREADLE_F32, TREADLE_F64, TREADLE_I64 or TREADLE_I32" in r["bad_dtype"][1]
    assert r["bad_policy"][0] == 1 and "policy must be 'fifo', 'firo' or 'reservoir'" in r["bad_policy"][1]
    assert r["resumed_bitwise"] and r["trained"]
