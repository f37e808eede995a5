"""SVG charts for bench/ with Debian's matplotlib (python3-matplotlib)."""
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def lines(path, series, xlabel, ylabel, title):
    """series: {name: [(x, y), ...]}"""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in series.items():
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=name, linewidth=1.8)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bars(path, values, ylabel, title, spread=None):
    """values: [(label, value), ...]; spread: [(min, max), ...] drawn as a
    range bar over each value (the runs' min to max)."""
    labels = [label for label, _ in values]
    heights = [v for _, v in values]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    yerr = None
    if spread:
        yerr = [[v - lo for v, (lo, _) in zip(heights, spread)], [hi - v for v, (_, hi) in zip(heights, spread)]]
    ax.bar(labels, heights, yerr=yerr, capsize=5, color=[f"C{i}" for i in range(len(values))])
    for i, v in enumerate(heights):
        ax.annotate(f"{v:.0f}", (i, v), textcoords="offset points", xytext=(12 if spread else 0, 3), ha="center",
                    fontsize=9)
    ax.set(ylabel=ylabel, title=title + (" (bars: median; whiskers: min-max over runs)" if spread else ""))
    ax.tick_params(axis="x", labelsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def grouped_bars(path, groups, series, ylabel, title, reference=None):
    """groups: [label, ...] along x; series: {name: [value per group]};
    reference: a value drawn as a dashed line (1.0 for ratios)."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name, color=f"C{i}")
        for x, v in zip(xs, values):
            ax.annotate(f"{v:.2f}", (x, v), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=9)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
