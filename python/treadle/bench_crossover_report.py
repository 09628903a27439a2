"""Markdown summary and plots of a crossover study result (bench/crossover.py writes the result)."""
import math
from pathlib import Path

_CLOCK = {"cpu": "CPU time of the calling thread, which runs every step: time spent descheduled on a busy "
                 "machine does not count",
          "wall": "wall-clock time: a device backend computes off this thread"}
MODES = (("infer", "inference"), ("train", "training step"))


def _us(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _runs(points, mode):
    """Consecutive batches with the same winner: [(winner, first batch, last batch, best lead)]."""
    runs = []
    for p in points:
        w, lead = p[mode]["winner"], p[mode]["margin"]
        if runs and runs[-1][0] == w:
            runs[-1][2] = p["batch"]
            runs[-1][3] = max(runs[-1][3] or 0, lead or 0) or None
        else:
            runs.append([w, p["batch"], p["batch"], lead])
    return runs


def summarize(config, mode, backends):
    """One line: who wins where along the batch axis, e.g. "eigen 1-16; onednn 64-4096 (up to 1.8x)"."""
    points = [p for p in config["points"] if p.get(mode)]
    if not points:
        return "no point measured"
    compared = [b for b in backends if b != "eigen" and any(b in p[mode]["us"] for p in points)]
    if backends != ["eigen"] and not compared:
        return "only eigen runs it (" + ", ".join(b for b in backends if b != "eigen") + " takes no node)"
    parts = []
    for w, b0, b1, lead in _runs(points, mode):
        span = f"{b0}" if b0 == b1 else f"{b0}-{b1}"
        extra = f" (up to {lead:.2f}x)" if lead and w != "tie" else ""
        parts.append(f"{w} {span}{extra}")
    return "; ".join(parts)


def _header(result):
    m, t, s = result["machine"], result["treadle"], result["settings"]
    flags = " ".join(f for f, on in m["flags"].items() if on) or "none of interest"
    load0 = ", ".join(f"{v:.2f}" for v in m.get("loadavg_at_start") or [])
    load1 = ", ".join(f"{v:.2f}" for v in m.get("loadavg_at_end") or [])
    lines = [f"# Backend crossover study ({result['date']})\n",
             f"- Machine: {m['cpu_model']}; {m['cpus_usable']} usable of {m['cpus_logical']} logical CPUs; flags: "
             f"{flags}; load average at start {load0}, at end {load1}",
             f"- treadle {t['version']} ({t['git'] or 'no git'}), backends built: {', '.join(t['backends'])}"]
    for name, b in result["backends"].items():
        if not b["available"]:
            lines.append(f"- **{name}**: {b['note']}")
        elif b["transfers_included"]:
            lines.append(f"- {name}: times include the host-device transfers (data starts on the host)")
    lines.append(f"- Method: sweep '{s['mode']}', batches {', '.join(map(str, s['batches']))}; points above "
                 f"{s['max_macs']:.3g} multiply-adds per forward skipped. Each backend pinned with set_backend; "
                 f"backends alternated in ~5 ms rounds, >= {s['min_time']} s of steps each; median us per step "
                 f"({_CLOCK[s['clock']]}). "
                 f"Inference = predict (inference plan); training step = forward + MSE + backward + SGD "
                 f"update (Trainer.step). treadle runs on {s['threads']} thread (the calling thread). A winner "
                 f"leads by >= {100 * (s['tie'] - 1):.0f}%, otherwise 'tie'. A backend that takes no node of a "
                 f"plan is not timed there ('-').")
    return lines + [""]


def _config_table(c, backends):
    head = ["batch", "MACs"]
    for _, label in MODES:
        head += [f"{label} {b}" for b in backends] + [f"{label} winner"]
    lines = [f"\n### {c['title']} ({c['name']})\n", "| " + " | ".join(head + ["load"]) + " |",
             "|" + "---|" * (len(head) + 1)]
    for p in c["points"]:
        cells = [str(p["batch"]), f"{p['macs']:.3g}"]
        for mode, _ in MODES:
            d = p[mode]
            cells += [_us(d["us"].get(b)) for b in backends]
            lead = f" ({d['margin']:.2f}x)" if d["margin"] else ""
            cells.append(f"{d['winner']}{lead}")
        cells.append("-" if p.get("loadavg") is None else f"{p['loadavg']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    if c["skipped"]:
        lines.append(f"\nSkipped (over the work cap): batch {', '.join(map(str, c['skipped']))}.")
    return lines


def _ratio_table(result, backend):
    """eigen time / `backend` time per configuration and batch ('-': the backend took no node)."""
    batches = result["settings"]["batches"]
    lines = []
    for mode, label in MODES:
        lines += [f"\n## {label}: eigen time / {backend} time (> 1: {backend} faster; '-': it takes no node)\n",
                  "| configuration \\ batch | " + " | ".join(map(str, batches)) + " |", "|" + "---|" * (len(batches) + 1)]
        for c in result["configs"]:
            by_batch = {p["batch"]: p[mode]["us"] for p in c["points"]}
            cells = ["" if b not in by_batch else "-" if backend not in by_batch[b]
                     else f"{by_batch[b]['eigen'] / by_batch[b][backend]:.2f}" for b in batches]
            lines.append(f"| {c['title']} | " + " | ".join(cells) + " |")
    return lines


def to_markdown(result):
    backends = [n for n, b in result["backends"].items() if b["available"]]
    lines = _header(result)
    lines += ["## Where each backend wins (batch ranges)\n", "| configuration | inference | training step |",
              "|---|---|---|"]
    for c in result["configs"]:
        lines.append(f"| {c['title']} | " + " | ".join(summarize(c, m, backends) for m, _ in MODES) + " |")
    for b in backends[1:]:
        lines += _ratio_table(result, b)
    lines.append("\n## Times (us per step, median)")
    for c in result["configs"]:
        lines += _config_table(c, backends)
    worst = max((v for c in result["configs"] for p in c["points"] for m, _ in MODES
                 for v in p[m]["max_rel_diff"].values()), default=0.0)
    lines.append(f"\nAgreement: the largest difference of any backend's output (or first loss) from eigen's, "
                 f"relative to max(1, |eigen|), is {worst:.2g}.")
    return "\n".join(lines) + "\n"


def plot_all(result, folder):
    """One PNG per configuration: time per step vs batch (log-log), one line per backend, inference
    and training side by side, crossovers marked. Returns the paths, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    backends = [n for n, b in result["backends"].items() if b["available"]]
    paths = []
    for c in result["configs"]:
        if not c["points"]:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, (mode, label) in zip(axes, MODES):
            for b in backends:
                pts = [(p["batch"], p[mode]["us"][b]) for p in c["points"] if b in p[mode]["us"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=b)
            for x in c["crossovers"][mode]:
                b0, b1 = x["between_batch"]
                at = math.sqrt(b0 * b1)
                ax.axvline(at, color="grey", linestyle="--", linewidth=1)
                ax.annotate(f"-> {x['after']}", (at, 0.92), xycoords=("data", "axes fraction"), fontsize=8,
                            rotation=90, ha="right", va="top")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch")
            ax.set_ylabel("us per step (median)")
            ax.set_title(label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"{c['title']}: {result['machine']['cpu_model']}, 1 thread ({result['date']})", fontsize=9)
        fig.tight_layout()
        path = folder / f"{c['name']}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
