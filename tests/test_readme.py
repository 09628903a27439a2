"""The README's Python example runs as written and learns."""
import os
import re

import numpy as np

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def test_readme_python_example_trains():
    blocks = re.findall(r"```python\n(.*?)```", open(README).read(), re.S)
    namespace = {}
    exec(blocks[0], namespace)  # noqa: S102 - our own documentation
    x, y, y_hat = namespace["x"], namespace["y"], namespace["y_hat"]
    assert y_hat.shape == y.shape and y_hat.dtype == np.float32
    assert namespace["loss"] < 0.5 * float(np.mean((y - y.mean()) ** 2))  # better than predicting the mean
