"""L-BFGS in closure form, torch.optim.LBFGS's algorithm over the model's flat buffers.

Each iteration needs the loss and the gradients at new parameter values, so the update is driven
from Python (a few vector operations on the flat buffers per iteration, numpy in the parameters'
dtype); the gradients come from the closure, typically a Trainer's compute_gradients::

    opt = tl.optim.LBFGS(model.parameters(), lr=1, line_search_fn="strong_wolfe")
    trainer = tl.Trainer(model, tl.loss.MSE(), opt)
    def closure():
        trainer.zero_grad()
        return trainer.compute_gradients(x, y)
    opt.step(closure)
"""
import numpy as np

from . import _core
from .optim_groups import normalize_groups, number, parameter_names


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to bounds."""
    xmin, xmax = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = np.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin), xmax)
    return (xmin + xmax) / 2.0


def _bracket(obj_func, x, t, d, f, g, gtd, c1, c2, max_ls):
    """Phase 1 of the strong-Wolfe search: grow the step until an interval holds a point satisfying it."""
    f_new, g_new = obj_func(x, t, d)
    evals, gtd_new = 1, g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            return [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new], False, ls_iter, evals
        if abs(gtd_new) <= -c2 * gtd:
            return [t], [f_new], [g_new], None, True, ls_iter, evals
        if gtd_new >= 0:
            return [t_prev, t], [f_prev, f_new], [g_prev, g_new.copy()], [gtd_prev, gtd_new], False, ls_iter, evals
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(t + 0.01 * (t - t_prev), t * 10))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.copy(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        evals, gtd_new = evals + 1, g_new.dot(d)
        ls_iter += 1
    return [0, t], [f, f_new], [g, g_new], None, False, ls_iter, evals


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's strong-Wolfe line search: bracketing, then zooming by cubic interpolation."""
    d_norm = np.abs(d).max()
    bracket, bf, bg, bgtd, done, ls_iter, evals = _bracket(obj_func, x, t, d, f, g.copy(), gtd, c1, c2, max_ls)
    insuf = False
    low, high = (0, 1) if bf[0] <= bf[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bf[0], bgtd[0], bracket[1], bf[1], bgtd[1])
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf = False
            else:
                insuf = True
        else:
            insuf = False
        f_new, g_new = obj_func(x, t, d)
        evals, gtd_new = evals + 1, g_new.dot(d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bf[low]:
            bracket[high], bf[high], bg[high], bgtd[high] = t, f_new, g_new.copy(), gtd_new
            low, high = (0, 1) if bf[0] <= bf[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                bracket[high], bf[high], bg[high], bgtd[high] = bracket[low], bf[low], bg[low], bgtd[low]
            bracket[low], bf[low], bg[low], bgtd[low] = t, f_new, g_new.copy(), gtd_new
    return bf[low], bg[low], bracket[low], evals


class LBFGS:
    """L-BFGS (torch.optim.LBFGS): ``step(closure)`` runs up to max_iter iterations, the closure
    returning the loss after computing the gradients at the current parameters.

    line_search_fn=None takes fixed steps of lr (torch's default); "strong_wolfe" runs torch's
    strong-Wolfe line search. Both follow torch's algorithm operation by operation (numpy in the
    parameters' dtype; dot products may round differently from torch's). One parameter group only.
    A Trainer built with it provides the gradients (compute_gradients in the closure); its own
    step/update leave the parameters unchanged (the compiled update is SGD with lr 0): only
    ``step(closure)`` moves them. Parameters not passed are not updated.
    """

    def __init__(self, params=None, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None):
        n = "LBFGS"
        lr = number(n, "lr", lr)
        if lr < 0:
            raise ValueError(f"LBFGS: invalid lr (learning rate) value: {lr}")
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got {line_search_fn!r}")
        max_iter = int(max_iter)
        self.defaults = dict(lr=lr, max_iter=max_iter, max_eval=int(max_eval or max_iter * 5 // 4),
                             tolerance_grad=number(n, "tolerance_grad", tolerance_grad),
                             tolerance_change=number(n, "tolerance_change", tolerance_change),
                             history_size=int(history_size), line_search_fn=line_search_fn)
        self._native = _core.optim.sgd(lr=0.0)
        self._module, self._sel = None, None
        self.state = {}
        if params is None:
            self.param_groups = [{"params": [], **self.defaults}]
            self._groups = None
            return
        groups = normalize_groups(n, params, {"lr": lr})
        if len(groups) != 1:
            raise ValueError("LBFGS: parameter groups are not supported (torch's LBFGS takes one group)")
        self._groups = groups
        self.param_groups = [{**self.defaults, **groups[0]}]

    def attach(self, module):
        """Finds the parameters in `module`'s flat buffer (called by the Trainer)."""
        if self._module is module:
            return self
        if self._module is not None and self._groups is not None:
            raise ValueError("LBFGS: its parameters belong to another model; create one optimizer per model")
        model = module._compiled()
        layout = {name: (offset, int(np.prod(shape, dtype=np.int64))) for name, shape, offset in model.layout}
        if self._groups is None:
            names = [name for name, p in module.named_parameter_objects() if p.requires_grad]
            dict.__setitem__(self.param_groups[0], "params", list(module.parameters()))
        else:
            names = parameter_names("LBFGS", module, self._groups)[0]
        ranges = sorted(layout[name] for name in dict.fromkeys(names))
        self._sel = np.concatenate([np.arange(o, o + k) for o, k in ranges]) if ranges else np.zeros(0, np.int64)
        self._module = module
        return self

    def zero_grad(self, set_to_none=True):
        self._require().zero_grad()

    def _require(self):
        if self._module is None:
            raise RuntimeError("LBFGS: not attached to a model; build a Trainer with it (or call attach(model)) first")
        return self._module._compiled()

    def _flat_grad(self):
        return self._require().flat_gradients()[self._sel]

    def _add(self, step, d):
        p = self._require().flat_parameters()
        p[self._sel] += step * d

    def _params_copy(self):
        return self._require().flat_parameters()[self._sel]

    def _set_params(self, x):
        self._require().flat_parameters()[self._sel] = x

    def _directional_evaluate(self, closure, x, t, d):
        self._add(t, d)
        loss = float(closure())
        g = self._flat_grad()
        self._set_params(x)
        return loss, g

    def step(self, closure):
        """Up to max_iter L-BFGS iterations; returns the closure's first loss."""
        if not callable(closure):
            raise TypeError("LBFGS.step: needs a closure that computes the gradients and returns the loss")
        group = self.param_groups[0]
        lr = group["lr"]
        st = self.state
        st.setdefault("func_evals", 0)
        st.setdefault("n_iter", 0)
        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        st["func_evals"] += 1
        g = self._flat_grad()
        if np.abs(g).max(initial=0) <= group["tolerance_grad"]:
            return orig_loss
        d, t = st.get("d"), st.get("t")
        prev_g, prev_loss = st.get("prev_flat_grad"), st.get("prev_loss")
        n_iter = 0
        while n_iter < group["max_iter"]:
            n_iter += 1
            st["n_iter"] += 1
            d = self._direction(g, d, t, prev_g)
            prev_g, prev_loss = g.copy(), loss
            t = min(1.0, 1.0 / np.abs(g).sum()) * lr if st["n_iter"] == 1 else lr
            gtd = g.dot(d)
            if gtd > -group["tolerance_change"]:
                break
            loss, g, t, evals, opt_cond = self._move(closure, group, d, t, loss, g, gtd, current_evals, n_iter)
            current_evals += evals
            st["func_evals"] += evals
            if n_iter == group["max_iter"] or current_evals >= group["max_eval"] or opt_cond:
                break
            if np.abs(d * t).max() <= group["tolerance_change"] or abs(loss - prev_loss) < group["tolerance_change"]:
                break
        st.update(d=d, t=t, prev_flat_grad=prev_g, prev_loss=prev_loss)
        return orig_loss

    def _direction(self, g, d, t, prev_g):
        """The search direction: -g first, then the two-loop recursion over the stored curvature pairs."""
        st = self.state
        if st["n_iter"] == 1:
            st.update(old_dirs=[], old_stps=[], ro=[], H_diag=1)
            return -g
        y, s = g - prev_g, d * t
        ys = y.dot(s)
        old_dirs, old_stps, ro = st["old_dirs"], st["old_stps"], st["ro"]
        if ys > 1e-10:
            if len(old_dirs) == self.param_groups[0]["history_size"]:
                old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
            old_dirs.append(y)
            old_stps.append(s)
            ro.append(1.0 / ys)
            st["H_diag"] = ys / y.dot(y)
        al = [None] * len(old_dirs)
        q = -g
        for i in range(len(old_dirs) - 1, -1, -1):
            al[i] = old_stps[i].dot(q) * ro[i]
            q = q + (-al[i]) * old_dirs[i]
        r = q * st["H_diag"]
        for i in range(len(old_dirs)):
            be_i = old_dirs[i].dot(r) * ro[i]
            r = r + (al[i] - be_i) * old_stps[i]
        return r

    def _move(self, closure, group, d, t, loss, g, gtd, current_evals, n_iter):
        """Takes the step along d (fixed or by line search); returns the new loss, gradient, step, the
        closure calls made and whether the gradient is below tolerance."""
        tol = group["tolerance_grad"]
        if group["line_search_fn"] == "strong_wolfe":
            x0 = self._params_copy()
            loss, g, t, evals = _strong_wolfe(lambda x, s, dd: self._directional_evaluate(closure, x, s, dd), x0, t, d,
                                              loss, g, gtd, max_ls=group["max_eval"] - current_evals)
            self._add(t, d)
            return loss, g, t, evals, np.abs(g).max() <= tol
        self._add(t, d)
        if n_iter == group["max_iter"]:
            return loss, g, t, 0, False
        loss = float(closure())
        g = self._flat_grad()
        return loss, g, t, 1, np.abs(g).max() <= tol

    def __repr__(self):
        return "LBFGS(" + ", ".join(f"{k}={v!r}" for k, v in self.defaults.items()) + ")"
