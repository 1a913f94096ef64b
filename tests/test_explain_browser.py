"""The `grail explain` page in a real browser: headless Chromium (Debian's `chromium` package; .ci/run installs
it) renders the page; its DOM (--dump-dom, with the page's ?selftest script recording what the browser computed)
must hold every token of every completion, each coloured as the documented scale says, and its screenshot must
show those colours where the tokens are drawn."""

import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from itertools import accumulate

import pytest

from grail.analysis.explain.html import render_page, weight_colour
from test_explain import build_explanation, by_completion, parse_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run "
                                "installs it): no `chromium` on PATH")
WIDTH, HEIGHT = 1000, 1500
TIMEOUT_S = 90


def _chromium(profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           "--force-device-scale-factor=1", f"--window-size={WIDTH},{HEIGHT}",
                           f"--user-data-dir={profile}", "--no-first-run", *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=True)


def read_png(data: bytes) -> tuple[int, int, Callable[[int, int], tuple[int, ...]]]:
    """(width, height, pixel(x, y) → (r, g, b)) of an 8-bit, non-interlaced RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunks.setdefault(kind, []).append(data[pos + 8:pos + 8 + length])
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    stride, rows, previous = width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:  # Sub: a running sum along each channel
            for ch in range(channels):
                line[ch::channels] = bytes(accumulate(line[ch::channels], lambda x, v: (x + v) & 255))
        elif kind == 2:  # Up
            line = bytearray((v + b) & 255 for v, b in zip(line, previous, strict=True))
        elif kind in (3, 4):  # Average, Paeth: byte by byte
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b, c = previous[i], previous[i - channels] if i >= channels else 0
                if kind == 3:
                    line[i] = (line[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, lambda x, y: tuple(rows[y][x * channels:x * channels + 3])


@pytest.fixture(scope="module")
def rendered(tiny_dir, tmp_path_factory):
    """(explanation, page file, parsed DOM after the browser ran the page, screenshot path)."""
    ex, _, _ = build_explanation(tiny_dir, methods=("grail", "oar_g", "entropy"))
    folder = tmp_path_factory.mktemp("browser")
    page = folder / "page.html"
    page.write_text(render_page(ex, {"model": "tiny test model"}), encoding="utf-8")
    dom = _chromium(folder / "profile-dom", "--dump-dom", page.as_uri() + "?selftest").stdout
    shot = folder / "shot.png"
    _chromium(folder / "profile-shot", f"--screenshot={shot}", page.as_uri() + "?selftest")
    return ex, page, parse_page(dom), shot


def _rgb(css: str) -> tuple[int, ...]:
    match = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, [\d.]+)?\)", css)
    assert match, css
    return tuple(int(v) for v in match.groups())


def test_browser_dom_holds_every_token_coloured_by_its_weight(rendered):
    ex, _, dom, _ = rendered
    assert dom.body.get("data-selftest") == "done", "the page's selftest script did not run"
    groups = by_completion(dom.tokens)
    assert set(groups) == {(c.row, c.sample, m) for c in ex.completions() for m in ex.methods}
    for c in ex.completions():
        for m in ex.methods:
            spans = groups[(c.row, c.sample, m)]
            assert "".join(s["text"] for s in spans) == c.text  # every token, in order, nothing added
            for s in spans:
                want = weight_colour(float(s["data-weight"]))
                got = _rgb(s["data-computed-bg"])
                assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 1, (s, got, want)


def test_screenshot_shows_the_tokens_in_their_colours(rendered):
    _, _, dom, shot = rendered
    width, height, pixel = read_png(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    # not one colour: text, bars, token colours
    assert len({pixel(x, y) for x in range(0, width, 7) for y in range(0, height, 7)}) > 20
    checked = 0
    for s in dom.tokens:
        left, top, w, h = (float(v) for v in s["data-rect"].split(","))
        if s["data-rects"] != "1" or w < 6 or h < 8 or top + h >= HEIGHT or left + w >= WIDTH:
            continue  # a token broken over lines, an empty one, or one below the window
        # the top padding of the token's box (3 px above the glyphs): its background and nothing else
        x, y = int(left + w / 2), int(top + 1)
        want = weight_colour(float(s["data-weight"]))
        got = pixel(x, y)
        assert max(abs(p - q) for p, q in zip(got, want, strict=True)) <= 2, (s["data-method"], s["text"], got, want)
        checked += 1
    assert checked >= 50, f"only {checked} tokens were in the window"


@pytest.mark.real
@pytest.mark.slow  # ~48 s (explain on SmolLM2); the token texts alone: test_real_model.py
def test_the_real_models_page_shows_its_bpe_tokens_as_text(real_model_dir, tmp_path):
    """`grail explain --model smollm2-135m` on given completions: in the browser, every token of every completion is
    there in order, as text (no byte-level `Ġ`/`Ċ` markers), for each method."""
    from grail.cli import main

    completions = ["Mia starts with 7 apples.\nAfter buying 5 more she has 7 + 5 = 12. \\boxed{12}",
                   "She has 7 + 5 = 13 apples. \\boxed{13}"]
    page = tmp_path / "real.html"
    argv = ["explain", "--model", "smollm2-135m", "--method", "grail,oar_g,entropy", "--prompt",
            "Mia has 7 apples. She buys 5 more. How many apples does she have now?", "--answer", "12",
            "--output", str(page)]
    for c in completions:
        argv += ["--completion", c]
    assert main(argv) == 0
    dom = parse_page(_chromium(tmp_path / "profile", "--dump-dom", page.as_uri() + "?selftest").stdout)
    assert dom.body.get("data-selftest") == "done"
    groups = by_completion(dom.tokens)
    assert {m for _, _, m in groups} == {"grail", "oar_g", "entropy"}
    for (_, sample, _), spans in groups.items():
        texts = [s["text"] for s in spans]
        assert "".join(texts) == completions[sample] + "<|im_end|>" or "".join(texts) == completions[sample]
        assert not any(ch in t for t in texts for ch in "ĠĊ"), texts
