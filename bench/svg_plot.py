"""Minimal SVG charts (lines and bars) for benchmark results, without
dependencies beyond Python's standard library."""

W, H, PAD = 640, 360, 56


def _axis(parts, x0, x1, y0, y1, xlabel, ylabel, title):
    parts.append(f'<text x="{W/2}" y="20" text-anchor="middle" font-size="15">{title}</text>')
    parts.append(f'<line x1="{PAD}" y1="{H-PAD}" x2="{W-PAD/2}" y2="{H-PAD}" stroke="black"/>')
    parts.append(f'<line x1="{PAD}" y1="{H-PAD}" x2="{PAD}" y2="{PAD/2}" stroke="black"/>')
    for i in range(5):
        fy = y0 + (y1 - y0) * i / 4
        py = H - PAD - (H - 1.5 * PAD) * i / 4
        parts.append(f'<text x="{PAD-6}" y="{py+4}" text-anchor="end" font-size="11">{fy:.3g}</text>')
        fx = x0 + (x1 - x0) * i / 4
        px = PAD + (W - 1.5 * PAD) * i / 4
        parts.append(f'<text x="{px}" y="{H-PAD+16}" text-anchor="middle" font-size="11">{fx:.3g}</text>')
    parts.append(f'<text x="{W/2}" y="{H-12}" text-anchor="middle" font-size="12">{xlabel}</text>')
    parts.append(f'<text x="14" y="{H/2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {H/2})">{ylabel}</text>')


COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def lines(path, series, xlabel, ylabel, title):
    """series: {name: [(x, y), ...]}"""
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    sx = lambda x: PAD + (W - 1.5 * PAD) * (x - x0) / (x1 - x0)
    sy = lambda y: H - PAD - (H - 1.5 * PAD) * (y - y0) / (y1 - y0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>']
    _axis(parts, x0, x1, y0, y1, xlabel, ylabel, title)
    for i, (name, pts) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{d}"/>')
        parts.append(f'<text x="{W-PAD/2-4}" y="{PAD/2+16*(i+1)}" text-anchor="end" font-size="12" fill="{c}">{name}</text>')
    parts.append("</svg>")
    open(path, "w").write("\n".join(parts))


def bars(path, values, ylabel, title):
    """values: [(label, value), ...]"""
    top = max(v for _, v in values) * 1.1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{W/2}" y="20" text-anchor="middle" font-size="15">{title}</text>',
             f'<line x1="{PAD}" y1="{H-PAD}" x2="{W-PAD/2}" y2="{H-PAD}" stroke="black"/>',
             f'<text x="14" y="{H/2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {H/2})">{ylabel}</text>']
    slot = (W - 1.5 * PAD) / len(values)
    for i, (label, v) in enumerate(values):
        h = (H - 1.5 * PAD) * v / top
        x = PAD + slot * i + slot * 0.15
        parts.append(f'<rect x="{x:.1f}" y="{H-PAD-h:.1f}" width="{slot*0.7:.1f}" height="{h:.1f}" fill="{COLORS[i % len(COLORS)]}"/>')
        parts.append(f'<text x="{x+slot*0.35:.1f}" y="{H-PAD-h-4:.1f}" text-anchor="middle" font-size="11">{v:.0f}</text>')
        parts.append(f'<text x="{x+slot*0.35:.1f}" y="{H-PAD+14}" text-anchor="middle" font-size="10">{label}</text>')
    parts.append("</svg>")
    open(path, "w").write("\n".join(parts))
