"""The lock order (docs/architecture.md, "Locks"): no binding waits for a library lock while it holds
the GIL, and no library lock is held while Python runs (a traced forward). Each scenario runs in a
child interpreter with several threads for a bounded time; a watchdog (faulthandler) dumps every
thread's stack and ends the child if it hangs, and the test fails with that dump."""
import os
import subprocess
import sys
import textwrap

import pytest

WATCHDOG_S = 60  # a scenario runs ~2 s; a deadlock never ends

_PRELUDE = textwrap.dedent("""
    import faulthandler, sys, tempfile, threading, time, os
    import numpy as np
    import treadle as tl
    faulthandler.dump_traceback_later({watchdog}, exit=True)  # a hang: every thread's stack, exit 1
    DURATION = {duration}
    errors = []

    class Net(tl.nn.Module):  # traced in Python: compiling it takes the GIL inside the library
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = tl.nn.Linear(4, 16), tl.nn.Linear(16, 1)

        def forward(self, x):
            return self.fc2(tl.functional.tanh(self.fc1(x))) + x[:, :1]

    def run(name, body):
        def loop():
            end, i = time.monotonic() + DURATION, 0
            while time.monotonic() < end:
                try:
                    body(i)
                except Exception as e:  # a failure, but the loop goes on: a hang is what it looks for
                    errors.append(f"{{name}}: {{type(e).__name__}}: {{e}}")
                i += 1
            counts[name] = i
        t = threading.Thread(target=loop, name=name)
        t.start()
        return t

    counts = {{}}
    tl.manual_seed(0)
    net = Net()
    rng = np.random.default_rng(0)
    """)

_SCENARIOS = {
    # The reported deadlock: one thread compiles new signatures while another sets model.fusion.
    "compile_vs_setters": """
        def compile_new(i):
            net.predict(rng.standard_normal((1 + i % 97, 4)).astype(np.float32))
        def toggle(i):
            model = net._compiled()
            model.fusion = bool(i % 2)
            model.deterministic = bool(i % 3)
        def read(i):
            model = net._compiled()
            model.num_plans
            model.describe_plans()
        threads = [run("compile", compile_new), run("setters", toggle), run("readers", read)]
        """,
    # Every public call that may take the model's lock, from several threads around one trainer.
    "train_predict_save": """
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
        path = os.path.join(tempfile.mkdtemp(), "net.safetensors")
        def step(i):
            n = 8 + i % 23  # new signatures keep compiling
            x = rng.standard_normal((n, 4)).astype(np.float32)
            trainer.step(x, x[:, :1] ** 2)
        def predict(i):
            net.predict(np.ones((1 + i % 31, 4), np.float32), context=ctx)
        def setters(i):
            model = net._compiled()
            model.fusion = bool(i % 2)
            if i % 5 == 0:
                net.set_backend("eigen" if i % 10 else "")
        def state(i):
            sd = net.state_dict()
            if i % 4 == 0:
                net.load_state_dict(sd)
            net._compiled().describe_plans()
        def save(i):
            tl.save(net, path)
        ctx = tl.Context()
        threads = [run("step", step), run("predict", predict), run("setters", setters), run("state", state),
                   run("save", save)]
        """,
}

_EPILOGUE = """
for t in threads:
    t.join()
faulthandler.cancel_dump_traceback_later()
assert not errors, sorted(set(errors))
assert all(n > 0 for n in counts.values()), counts
print("ok", sorted(counts.items()))
"""


@pytest.mark.parametrize("scenario", sorted(_SCENARIOS))
def test_concurrent_calls_never_deadlock(scenario):
    script = _PRELUDE.format(watchdog=WATCHDOG_S, duration=2.0) + textwrap.dedent(_SCENARIOS[scenario]) + _EPILOGUE
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WATCHDOG_S + 60,
                          env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert "Timeout (0:" not in proc.stderr, f"{scenario} hung; the threads' stacks:\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.stdout.startswith("ok"), proc.stdout
