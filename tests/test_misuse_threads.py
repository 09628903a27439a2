"""Concurrent misuse raises instead of crashing or corrupting: a Trainer, a Context, and the trainers
of one model serve one thread at a time (docs/architecture.md, "Threads"). Each scenario runs in a
child interpreter (a crash fails one test, with its stack from faulthandler)."""
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = textwrap.dedent("""
    import faulthandler, threading
    import numpy as np
    import treadle as tl
    faulthandler.enable()
    faulthandler.dump_traceback_later(120, exit=True)

    def net():
        tl.manual_seed(0)
        return tl.nn.Sequential(tl.nn.Linear(32, 256), tl.nn.Tanh(), tl.nn.Linear(256, 4))

    rng = np.random.default_rng(0)
    X = rng.standard_normal((512, 32)).astype(np.float32)
    Y = rng.standard_normal((512, 4)).astype(np.float32)

    def hammer(calls, per_thread=40):
        # every thread runs its call per_thread times; returns (successes, refusals' messages)
        done, refused, other = [], [], []
        barrier = threading.Barrier(len(calls))
        def loop(call):
            barrier.wait()
            for _ in range(per_thread):
                try:
                    done.append(call())
                except RuntimeError as e:
                    refused.append(str(e))
                except Exception as e:
                    other.append(f"{type(e).__name__}: {e}")
        threads = [threading.Thread(target=loop, args=(c,)) for c in calls]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not other, other[:3]
        return done, refused
""")

SCENARIOS = {
    "one trainer, two threads": """
        model = net()
        trainer = tl.Trainer(model, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        done, refused = hammer([lambda: trainer.step(X, Y)] * 2)
        assert refused and all("another thread is inside Trainer.step" in m for m in refused), refused[:2]
        # every step that ran, ran whole: the result is that of as many steps in a row
        twin = net()
        serial = tl.Trainer(twin, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        for _ in range(trainer.steps):
            serial.step(X, Y)
        assert trainer.steps == len(done)
        np.testing.assert_array_equal(model.flat_parameters(), twin.flat_parameters())
    """,
    "one trainer, step against the phases": """
        trainer = tl.Trainer(net(), tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        def phases():
            trainer.zero_grad(); loss = trainer.compute_gradients(X, Y); trainer.update(); return loss
        done, refused = hammer([lambda: trainer.step(X, Y), phases, lambda: trainer.evaluate(X, Y)])
        assert refused and done
        assert all("another thread is inside" in m for m in refused), refused[:2]
    """,
    "two trainers of one model": """
        model = net()
        a = tl.Trainer(model, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        b = tl.Trainer(model, tl.loss.L1(), tl.optim.SGD(lr=1e-3))
        done, refused = hammer([lambda: a.step(X, Y), lambda: b.step(X, Y)])
        assert refused and all("trainers of one model" in m for m in refused), refused[:2]
        assert a.steps + b.steps == len(done)
    """,
    "one context, two threads predicting": """
        model = net()
        expected = model.predict(X)
        shared = tl.Context()
        done, refused = hammer([lambda: model.predict(X, context=shared)] * 2, per_thread=200)
        assert refused and all("this Context is in use by another thread" in m for m in refused), refused[:2]
        for y in done:
            np.testing.assert_array_equal(y, expected)
    """,
    "own contexts never collide": """
        model = net()
        expected = model.predict(X)
        contexts = [tl.Context(), tl.Context()]
        done, refused = hammer([lambda c=c: model.predict(X, context=c) for c in contexts], per_thread=100)
        assert not refused and len(done) == 200
        for y in done:
            np.testing.assert_array_equal(y, expected)
    """,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_concurrent_misuse_raises_and_corrupts_nothing(name):
    code = _PRELUDE + textwrap.dedent(SCENARIOS[name]) + "\nprint('ok')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
