r"""`grail explain`, the rendering side: one self-contained HTML page (no external script, style sheet or font)
and a PNG of the position profiles.

Colour scale (`weight_colour`), diverging and centred at w = 1, GRPO's uniform weight:
    s = clip(log2(w) / 2, −1, 1)          w = ¼ → −1, w = 1 → 0, w = 4 → +1; w ≤ 0 → −1; NaN → grey
    colour = white + |s| · (end − white)   end = RED for s > 0, BLUE for s < 0; channels rounded
so equal ratios above and below 1 get equal depths (w = 2 and w = ½ are equally deep), and every weight outside
[¼, 4] has the colour of the nearest end (GRAIL's answer tokens, w = 5, are full red).

Every token is one `<span class="tok">` whose text is the token's (escaped), with a tooltip (`title`: the token's
text, line breaks and control characters made visible, then raw signal, weight, Â = w·A, A) and data attributes
a test can read from the DOM: data-row, data-sample, data-method, data-index, data-weight, data-signal ("" where
the probe did not run), data-adv (Â), and data-answer / data-box (1 inside the answer span / the whole box).
Loaded with `?selftest` in its URL, the page records each token's computed background colour and box in
data-computed-bg and data-rect (tests/test_explain_browser.py reads them with Chromium's --dump-dom).
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grail.analysis.explain.compute import CompletionView, Explanation

__all__ = ["BLUE", "GREY", "HIGH", "LOW", "RED", "WHITE", "css_colour", "profile_svg", "render_page",
           "weight_colour", "write_profile_png"]

LOW, HIGH = 0.25, 4.0  # weights at the ends of the scale (log2 = −2, +2)
WHITE, RED, BLUE, GREY = (255, 255, 255), (214, 96, 77), (67, 147, 195), (190, 190, 190)


def weight_colour(weight: float) -> tuple[int, int, int]:
    """The (r, g, b) of a weight on the page's diverging scale (module docstring)."""
    if math.isnan(weight):
        return GREY
    s = -1.0 if weight <= 0 else max(-1.0, min(1.0, math.log2(weight) / math.log2(HIGH)))
    end = RED if s > 0 else BLUE
    return tuple(round(w + abs(s) * (e - w)) for w, e in zip(WHITE, end, strict=True))


def css_colour(rgb: tuple[int, int, int]) -> str:
    """As Chromium's getComputedStyle writes a colour: `rgb(r, g, b)`."""
    return f"rgb({rgb[0]}, {rgb[1]}, {rgb[2]})"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    return f"{x:.6g}"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#111;background:#fff}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:20px 0 6px} h3{font-size:14px;margin:10px 0 4px}
table.settings{border-collapse:collapse;font-size:12px} table.settings td{padding:1px 10px 1px 0;vertical-align:top}
table.settings td:first-child{color:#555;white-space:nowrap}
pre.prompt{background:#f4f4f4;padding:6px 8px;white-space:pre-wrap;overflow-wrap:anywhere;margin:4px 0}
.legend{display:flex;align-items:center;gap:8px;font-size:12px;margin:8px 0}
.legend .bar{display:flex;border:1px solid #999;flex:none}
.legend .bar span{width:18px;height:14px;display:inline-block}
.legend b,.legend .end{white-space:nowrap;flex:none}
.profiles{display:flex;flex-wrap:wrap;gap:16px}
.completion{border-top:1px solid #ddd;padding:6px 0}
.meta{font-size:12px;color:#333;margin-bottom:2px}
.method{display:grid;grid-template-columns:80px 1fr;gap:8px;margin:2px 0}
.method .label{font-size:12px;font-weight:600;padding-top:3px}
.toks{font:13px/1.9 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.tok{padding:3px 0 2px}
.tok.ans{box-shadow:inset 0 -3px 0 #000}
.tok.box{box-shadow:inset 0 -2px 0 #888}
.tok.empty{padding:3px 1px 2px;border-left:1px dotted #999}
.tok:hover{outline:1px solid #000}
.note{font-size:11px;color:#a33;grid-column:2}
"""

# Runs only with ?selftest in the URL: records what the browser drew, for tests/test_explain_browser.py.
_SELFTEST = """<script>
if (/[?&]selftest\\b/.test(location.search)) {
  for (const el of document.querySelectorAll('.tok')) {
    const r = el.getClientRects()[0] || el.getBoundingClientRect();
    el.setAttribute('data-computed-bg', getComputedStyle(el).backgroundColor);
    el.setAttribute('data-rect', [r.left, r.top, r.width, r.height].map(v => v.toFixed(1)).join(','));
    el.setAttribute('data-rects', String(el.getClientRects().length));
  }
  document.body.setAttribute('data-selftest', 'done');
}
</script>"""


def _legend() -> str:
    stops = [2 ** (k / 4) for k in range(-10, 11)]  # ⅙ .. 6: the clipped ends show too
    cells = "".join(f'<span style="background-color:{css_colour(weight_colour(w))}" title="w = {w:.3g}"></span>'
                    for w in stops)
    return (f'<div class="legend"><b>weight w</b><span class="end">≤ ¼</span><div class="bar">{cells}</div>'
            f'<span class="end">≥ 4</span>'
            f'<span>colour: log₂ w on a diverging scale, white at w = 1 (GRPO\'s uniform weight), blue below, red '
            f'above, equal depth for w and 1/w, clipped at ¼ and 4. <u>Underlined</u>: the answer span (inside '
            f'<code>\\boxed{{}}</code>); grey underline: <code>\\boxed{{</code> and <code>}}</code>. Hover a token '
            f'for its signal, weight and Â = w·A.</span></div>')


def profile_svg(profile: tuple[float, ...], counts: tuple[int, ...], label: str) -> str:
    """An inline SVG bar chart: mean weight per position bin, bars coloured by the weight scale, w = 1 dashed."""
    width, height, left, bottom, top = 280, 150, 34, 24, 18
    plot_w, plot_h = width - left - 8, height - bottom - top
    filled = [w for w, c in zip(profile, counts, strict=True) if c > 0]
    y_max = max([2.0, *filled]) * 1.05
    n = len(profile)

    def y(w: float) -> float:
        return top + plot_h * (1 - w / y_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'class="profile" data-method-label="{_e(label)}"><title>{_e(label)}: mean weight per tenth of the '
             f'reasoning</title>',
             f'<text x="{left}" y="12" font-size="12" font-weight="600">{_e(label)}</text>']
    for k, (w, c) in enumerate(zip(profile, counts, strict=True)):
        x = left + plot_w * k / n
        if c > 0:
            parts.append(f'<rect x="{x + 1:.1f}" y="{y(w):.1f}" width="{plot_w / n - 2:.1f}" '
                         f'height="{top + plot_h - y(w):.1f}" fill="{css_colour(weight_colour(w))}" stroke="#666" '
                         f'stroke-width="0.5" data-bin="{k}" data-mean="{_num(w)}"><title>bin {k}: mean w '
                         f'{w:.3f} over {c} tokens</title></rect>')
    parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#000" '
                 f'stroke-dasharray="4 3"/>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#000"/>'
                 f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#000"/>')
    for tick in (0, 1, 2) + ((int(y_max),) if y_max >= 3 else ()):
        parts.append(f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end">{tick}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}" font-size="10">0</text>'
                 f'<text x="{left + plot_w}" y="{height - 6}" font-size="10" text-anchor="end">1</text>'
                 f'<text x="{left + plot_w / 2}" y="{height - 6}" font-size="10" text-anchor="middle">position in '
                 f'the reasoning</text>')
    if not filled:
        parts.append(f'<text x="{left + 8}" y="{top + plot_h / 2}" font-size="11">no reasoning tokens in rows '
                     f'with A ≠ 0</text>')
    parts.append("</svg>")
    return "".join(parts)


_VISIBLE = {"\n": "⏎", "\t": "⇥", "\r": "␍"}  # whitespace a tooltip could not show


def _shown(token: str) -> str:
    """A token as its tooltip shows it: its text as it is (one backslash is one backslash: not Python's repr),
    with line breaks, tabs and other control characters made visible."""
    return "".join(_VISIBLE.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}") for ch in token)


def _tooltip(token: str, signal: float | None, weight: float, adv: float) -> str:
    sig = "not computed" if signal is None else f"{signal:.4g}"
    return (f"token “{_shown(token)}”\nsignal {sig}\nweight w = {weight:.4g}\nÂ = w·A = {weight * adv:.4g} "
            f"(A = {adv:.4g})")


def _tokens(c: CompletionView, method: str) -> str:
    m = c.methods[method]
    spans = []
    for i, (token, w) in enumerate(zip(c.tokens, m.weights, strict=True)):
        signal = None if m.signal is None else m.signal[i]
        classes = "tok" + (" ans" if c.answer[i] else " box" if c.box[i] else "") + ("" if token else " empty")
        spans.append(
            f'<span class="{classes}" style="background-color:{css_colour(weight_colour(w))}" '
            f'data-row="{c.row}" data-sample="{c.sample}" data-method="{_e(method)}" data-index="{i}" '
            f'data-weight="{_num(w)}" data-signal="{"" if signal is None else _num(signal)}" '
            f'data-adv="{_num(w * c.advantage)}" data-answer="{int(c.answer[i])}" data-box="{int(c.box[i])}" '
            f'title="{_e(_tooltip(token, signal, w, c.advantage))}">{_e(token)}</span>')
    return "".join(spans)  # no whitespace between tokens: the text is exactly the completion's


def _completion(c: CompletionView, ex: Explanation) -> str:
    reward = "" if c.reward is None else f"reward {c.reward:g}, "
    rows = [f'<div class="completion" data-row="{c.row}" data-sample="{c.sample}">'
            f'<div class="meta">completion {c.sample}: {reward}A = {c.advantage:+.4g}, {len(c.tokens)} tokens</div>']
    for method in ex.methods:
        note = c.methods[method].note
        rows.append(f'<div class="method" data-method="{_e(method)}"><span class="label">{_e(ex.labels[method])}'
                    f'</span><div class="toks">{_tokens(c, method)}</div>'
                    + (f'<div class="note">{_e(note)}</div>' if note else "") + "</div>")
    rows.append("</div>")
    return "".join(rows)


def render_page(ex: Explanation, settings: dict[str, str] | None = None) -> str:
    """The whole page as one HTML string (every piece of text escaped)."""
    settings = {**(settings or {}), "advantages": ex.advantage_source}
    table = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in settings.items())
    profiles = "".join(profile_svg(ex.profiles[m], ex.profile_counts[m], ex.labels[m]) for m in ex.methods)
    body = [f'<h1>grail explain: where the credit goes</h1><table class="settings">{table}</table>', _legend(),
            '<h2>Position profile</h2><p style="font-size:12px;margin:0 0 4px">Mean weight per tenth of the '
            'reasoning (tokens before the answer box; the j-th of a row\'s R reasoning tokens is in bin '
            'floor(10·j/R)), pooled over the completions with A ≠ 0, as the training metric '
            '<code>weights/position_profile</code>. Dashed: w = 1.</p>', f'<div class="profiles">{profiles}</div>']
    for row in ex.rows:
        answer = "unknown" if row.answer is None else _e(row.answer)
        title = f"Prompt {row.index}" + (f" ({_e(row.label)})" if row.label else "")
        body.append(f'<section class="row" data-row="{row.index}"><h2>{title}</h2><pre class="prompt">'
                    f'{_e(row.prompt)}</pre><div class="meta">reference answer: {answer}</div>')
        body.extend(_completion(c, ex) for c in row.completions)
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>grail explain</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}{_SELFTEST}</body></html>\n")


def write_profile_png(ex: Explanation, path: str | Path) -> bool:
    """The position profiles as a PNG (matplotlib, Agg canvas); False (nothing written) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    bins = len(ex.profiles[ex.methods[0]])
    centres = [(k + 0.5) / bins for k in range(bins)]
    for method in ex.methods:
        points = [(x, w) for x, w, c in zip(centres, ex.profiles[method], ex.profile_counts[method], strict=True)
                  if c > 0]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=ex.labels[method])
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("position in the reasoning (bin centre)")
    ax.set_ylabel("mean weight w")
    ax.set_title("Position profile (completions with A ≠ 0)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))
    return True
