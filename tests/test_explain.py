"""`grail explain`: the colour scale, the page (escaping, every token of every completion for every method), the
weights against the functional API, the position profile against diagnostics' definition, GRPO's group advantages,
and the command's errors and outputs through `grail.cli.main`."""

import json
import math
import re
import statistics
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

from grail.analysis.explain.compute import (
    CompletionView,
    ExplainRow,
    Explanation,
    MethodTokens,
    RowView,
    explain,
    group_advantages,
)
from grail.analysis.explain.html import BLUE, GREY, HIGH, LOW, RED, WHITE, render_page, weight_colour, write_profile_png
from grail.cli import main
from grail.evaluation.rewards import exact_int_reward
from grail.methods.table import METHODS
from grail.methods.weighting import method_function
from grail.options.choices import WeightingOptions
from grail.options.sampling import SamplingParams

ALL_METHODS = tuple(METHODS)  # every method of the table, plug-ins included
PROMPT = "Q: 7+5*3\nA:"
# Right, wrong, no box (and HTML, a two-byte character, a special token): every kind of row a page shows.
COMPLETIONS = (" 7+5=12, 12*3=36. \\boxed{36}<|endoftext|>", " 7+5=12, 12*3=35. \\boxed{35}",
               " 7+5=13 <script>alert('x')</script> & é", " so 7+5=12, now 12*3=36. \\boxed{36}")


class TokenSpans(HTMLParser):
    """Every `<span class="tok ...">` of a page: its attributes and its text (entities decoded)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tokens: list[dict] = []
        self.scripts = 0
        self.body: dict = {}
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "body":
            self.body = attrs
        if tag == "span" and "tok" in (attrs.get("class") or "").split():
            self._open = {**attrs, "text": ""}
            self.tokens.append(self._open)

    def handle_endtag(self, tag):
        if tag == "span":
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data


def parse_page(page: str) -> TokenSpans:
    parser = TokenSpans()
    parser.feed(page)
    parser.close()
    return parser


def by_completion(tokens: list[dict]) -> dict[tuple[int, int, str], list[dict]]:
    """Token elements grouped by (row, sample, method), in index order."""
    groups: dict[tuple[int, int, str], list[dict]] = {}
    for t in tokens:
        groups.setdefault((int(t["data-row"]), int(t["data-sample"]), t["data-method"]), []).append(t)
    for group in groups.values():
        assert [int(t["data-index"]) for t in group] == list(range(len(group)))
    return groups


def tiny_model(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


def build_explanation(tiny_dir, methods=ALL_METHODS, **kwargs) -> tuple[Explanation, object, object]:
    """Two prompts with given completions on the test's tiny model, graded with exact_int (GRPO's group
    advantages, no std scaling), every method."""
    model, tokenizer = tiny_model(tiny_dir)
    rows = [ExplainRow(PROMPT, "36", COMPLETIONS, "first"), ExplainRow("Q: 2+2\nA:", "4", (" 2+2=4. \\boxed{4}",
                                                                                       " 2+2=5. \\boxed{5}"))]
    ex = explain(model, tokenizer, rows, methods, WeightingOptions(rollout_symmetry="both"),
                 sampling=SamplingParams(n=2), seed=0, reward_fn=exact_int_reward, scale_rewards="none", **kwargs)
    return ex, model, tokenizer


# ---- the colour scale ---------------------------------------------------------------------------------------

def _signed_depth(rgb) -> int:
    """How far along its arm of the scale a colour is: + towards red (green falls 255 → 96), − towards blue (red
    falls 255 → 67), 0 at white."""
    r, g, b = rgb
    return (255 - g) if r > b else -(255 - r) if b > r else 0


def test_weight_colour_is_white_at_one_monotone_and_clipped():
    assert weight_colour(1.0) == WHITE
    # Half way along each arm: log2(2)/2 = +0.5 and log2(1/2)/2 = −0.5, white + 0.5·(end − white), rounded.
    assert weight_colour(2.0) == tuple(round(255 + 0.5 * (e - 255)) for e in RED)
    assert weight_colour(0.5) == tuple(round(255 + 0.5 * (e - 255)) for e in BLUE)
    assert weight_colour(HIGH) == weight_colour(5.0) == weight_colour(1e9) == weight_colour(math.inf) == RED
    assert weight_colour(LOW) == weight_colour(0.1) == weight_colour(0.0) == weight_colour(-1.0) == BLUE
    assert weight_colour(math.nan) == GREY
    grid = [0.1 + 0.01 * k for k in range(600)]  # 0.1 .. 6.09
    depths = [_signed_depth(weight_colour(w)) for w in grid]
    assert depths == sorted(depths)  # monotone in w
    # red above 1, blue below
    assert all((d > 0) == (w > 1) for w, d in zip(grid, depths, strict=True) if abs(w - 1) > 0.02)
    assert len(set(depths)) > 100  # not a step function


# ---- the page ------------------------------------------------------------------------------------------------

def _hand_made(tokens: tuple[str, ...], prompt: str = "Q", label: str = "") -> Explanation:
    n = len(tokens)
    weights = tuple(0.5 + 0.5 * i for i in range(n))
    view = CompletionView(0, 0, "".join(tokens), tokens, (False,) * n, (False,) * n, (True,) * n, 0.0, -1.0,
                          {"grail": MethodTokens(weights, tuple(float(i) for i in range(n)), "")})
    return Explanation((RowView(0, label, prompt, None, (view,)),), ("grail",), {"grail": "GRAIL"},
                       {"grail": (1.0,) * 10}, {"grail": (1,) * 10}, "given")


def test_page_escapes_every_text_it_shows():
    tokens = ("<script>alert(1)</script>", '" onmouseover="alert(2)', "&amp;", "\n", "</span><b>x</b>")
    page = render_page(_hand_made(tokens, prompt="</pre><script>alert(3)</script>", label="<img src=x>"),
                       {"model": "<i>m</i>"})
    for raw in ("<script>alert", "<img src=x>", "<i>m</i>", '" onmouseover', "</span><b>"):
        assert raw not in page
    parsed = parse_page(page)
    assert parsed.scripts == 1  # the page's own selftest script, nothing injected
    assert [t["text"] for t in parsed.tokens] == list(tokens)  # each token's text comes back exactly
    assert [float(t["data-weight"]) for t in parsed.tokens] == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert "<script>alert(1)</script>" in parsed.tokens[0]["title"]  # the tooltip shows the text, escaped in source


def test_tooltips_show_a_token_as_it_is_with_line_breaks_made_visible():
    """One backslash is one backslash in the tooltip (not Python's repr, which doubled it: `\\\\boxed`)."""
    tokens = ("\\boxed{", "1\n2", "x\x08y")
    titles = [t["title"] for t in parse_page(render_page(_hand_made(tokens))).tokens]
    assert titles[0].startswith("token “\\boxed{”\n") and "\\\\" not in titles[0]
    assert titles[1].startswith("token “1⏎2”\n") and titles[2].startswith("token “x\\x08y”\n")


def test_the_temperature_is_shown_as_a_sampling_setting_not_a_weighting_option(tiny_dir, tmp_path, capsys):
    out = tmp_path / "t.html"
    assert main(["explain", "--model", str(tiny_dir), "--prompt", "Q: 1+1\nA:", "--completion", " \\boxed{2}",
                 "--answer", "2", "--temperature", "0.7", "--output", str(out)]) == 0, capsys.readouterr().err
    settings = dict(re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td></tr>", out.read_text(encoding="utf-8")))
    assert "temperature" not in settings["weighting options"]
    assert settings["temperature"].startswith("0.7 (the probes divide the logits by it")


def test_page_shows_every_token_of_every_completion_for_every_method(tiny_dir):
    ex, _, tokenizer = build_explanation(tiny_dir)
    groups = by_completion(parse_page(render_page(ex)).tokens)
    completions = ex.completions()
    assert len(completions) == len(COMPLETIONS) + 2
    assert set(groups) == {(c.row, c.sample, m) for c in completions for m in ALL_METHODS}
    given = [*COMPLETIONS, " 2+2=4. \\boxed{4}", " 2+2=5. \\boxed{5}"]
    for c, text in zip(completions, given, strict=True):
        assert c.text == "".join(c.tokens) == text  # the tiny tokenizer is lossless, special tokens included
        for m in ALL_METHODS:
            spans = groups[(c.row, c.sample, m)]
            assert "".join(s["text"] for s in spans) == text
            assert [float(s["data-weight"]) for s in spans] == pytest.approx(c.methods[m].weights, rel=1e-5)
            assert all((s["data-signal"] == "") == (c.methods[m].signal is None) for s in spans)
            assert [s["data-answer"] == "1" for s in spans] == list(c.answer)
    html_row = completions[2]  # no box: its tokens are all reasoning and no answer token is marked
    assert not any(html_row.answer) and all(html_row.reasoning)
    assert "no complete \\boxed{}" in html_row.methods["grail"].note


def test_weights_are_the_functional_apis_and_advantages_grpos(tiny_dir):
    ex, model, tokenizer = build_explanation(tiny_dir)
    rewards = [1.0, 0.0, 0.0, 1.0]  # exact_int against 36: right, wrong (35), no box, right
    row = ex.rows[0]
    assert [c.reward for c in row.completions] == rewards
    assert [c.advantage for c in row.completions] == [r - 0.5 for r in rewards]  # scale_rewards=none
    prompt = tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")
    done = tokenizer(list(COMPLETIONS), add_special_tokens=False, padding=True, padding_side="right",
                     return_tensors="pt")
    G = len(COMPLETIONS)
    adv = torch.tensor([r - 0.5 for r in rewards])
    for method in ("grail", "entropy", "oar_p"):  # the deterministic ones (random and OAR-G draw from an RNG)
        expected = method_function(method)(model, tokenizer, prompt["input_ids"].repeat(G, 1),
                                            prompt["attention_mask"].repeat(G, 1), done["input_ids"],
                                            done["attention_mask"], adv, rollout_symmetry="both")
        for b, c in enumerate(row.completions):
            n = len(c.tokens)
            assert c.methods[method].weights == pytest.approx(expected[b, :n].tolist(), abs=1e-5), (method, b)
    assert all(w == 1.0 for c in ex.completions() for w in c.methods["none"].weights)


def test_position_profile_is_diagnostics_definition(tiny_dir):
    ex, _, _ = build_explanation(tiny_dir)
    for method in ALL_METHODS:
        sums, counts = [0.0] * 10, [0] * 10
        for c in ex.completions():
            if c.advantage == 0:
                continue  # rows with A = 0 carry no gradient and are not described
            reasoning = [i for i, r in enumerate(c.reasoning) if r]
            for j, i in enumerate(reasoning):
                k = 10 * j // len(reasoning)  # the j-th of R reasoning tokens → bin floor(10·j / R)
                sums[k] += c.methods[method].weights[i]
                counts[k] += 1
        assert list(ex.profile_counts[method]) == counts
        means = [s / n if n else 0.0 for s, n in zip(sums, counts, strict=True)]
        assert list(ex.profiles[method]) == pytest.approx(means, abs=1e-6)


def test_outcome_profiles_split_the_rows_by_the_sign_of_their_advantage(tiny_dir):
    """The GRAIL release's split: the same definition over rows with A > 0 ("correct") and A < 0 ("wrong") apart;
    their token counts add up to the pooled profile's."""
    ex, _, _ = build_explanation(tiny_dir)
    for method in ALL_METHODS:
        for outcome, keep in (("correct", lambda a: a > 0), ("wrong", lambda a: a < 0)):
            sums, counts = [0.0] * 10, [0] * 10
            for c in ex.completions():
                if not keep(c.advantage):
                    continue
                reasoning = [i for i, r in enumerate(c.reasoning) if r]
                for j, i in enumerate(reasoning):
                    sums[10 * j // len(reasoning)] += c.methods[method].weights[i]
                    counts[10 * j // len(reasoning)] += 1
            assert list(ex.outcome_counts[method][outcome]) == counts, (method, outcome)
            means = [s / n if n else 0.0 for s, n in zip(sums, counts, strict=True)]
            assert list(ex.outcome_profiles[method][outcome]) == pytest.approx(means, abs=1e-6)
        both = [a + b for a, b in zip(*ex.outcome_counts[method].values(), strict=True)]
        assert both == list(ex.profile_counts[method]) and sum(both) > 0


def test_group_advantages_are_grpos():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0], [0.5]]
    # Hand case: mean 0.25, unbiased std sqrt((0.75² + 3·0.25²)/3) = 0.5, so A = (r − 0.25) / (0.5 + 1e-4).
    assert group_advantages(rewards, "group")[0] == pytest.approx([0.75 / 0.5001] + [-0.25 / 0.5001] * 3)
    everything = [r for group in rewards for r in group]
    for scale in ("group", "batch", "none"):
        got = group_advantages(rewards, scale)
        for group, adv in zip(rewards, got, strict=True):
            mean = statistics.fmean(group)
            std = {"group": statistics.stdev(group) if len(group) > 1 else 0.0,
                   "batch": statistics.stdev(everything)}.get(scale)
            assert adv == pytest.approx([(r - mean) / (1.0 if std is None else std + 1e-4) for r in group])
    assert group_advantages([[1.0, 1.0]], "group") == [[0.0, 0.0]]  # equal rewards: no gradient, no NaN
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(rewards, "std")


def test_explain_needs_an_answer_or_an_advantage(tiny_dir):
    model, tokenizer = tiny_model(tiny_dir)
    with pytest.raises(ValueError, match="--advantage"):
        explain(model, tokenizer, [ExplainRow(PROMPT, None, (" 1",))], ("grail",), WeightingOptions(),
                sampling=SamplingParams(n=1), reward_fn=exact_int_reward)
    ex = explain(model, tokenizer, [ExplainRow(PROMPT, None, (" 7+5=12. \\boxed{12}",))], ("grail",),
                 WeightingOptions(), sampling=SamplingParams(n=1), advantage=-1.0)
    (c,) = ex.completions()
    assert c.advantage == -1.0 and c.reward is None and c.methods["grail"].signal is not None
    assert "given" in ex.advantage_source


def test_profile_png_is_written(tiny_dir, tmp_path):
    pytest.importorskip("matplotlib")
    ex, _, _ = build_explanation(tiny_dir, methods=("grail", "entropy"))
    assert write_profile_png(ex, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the command ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--model", "tiny", "--method", "grail,bogus", "--prompt", "x"], "unknown method bogus"),
    (["--model", "tiny", "--method", "grail,grail", "--prompt", "x"], "twice"),
    (["--model", "./no/such/model", "--prompt", "x"], "does not exist"),
    (["--prompt", "x"], "needs --model"),
    (["--model", "tiny", "--prompt", "x", "--dataset", "synthetic"], "got both"),
    (["--model", "tiny"], "got neither"),
    (["--model", "tiny", "--dataset", "synthetic", "--rows", "0"], "--rows 0"),
    (["--model", "tiny", "--dataset", "synthetic", "--completion", "x"], "go with --prompt"),
])
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys):
    assert main(["explain", *argv]) == 2
    assert message in capsys.readouterr().err


def test_help_does_not_import_torch():
    code = ("from grail.cli import main\ntry:\n    main(['explain', '--help'])\nexcept SystemExit:\n    pass\n"
            "import sys\nprint(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--method" in out and not {"torch", "trl"} & {name.split(".")[0] for name in out.split()}


def _advantages(page: str) -> dict[tuple[int, int], float]:
    """A of each completion, read back from its first token's data-adv (Â) and data-weight (w) of method `none`."""
    groups = by_completion(parse_page(page).tokens)
    return {(row, sample): float(spans[0]["data-adv"]) / float(spans[0]["data-weight"])
            for (row, sample, method), spans in groups.items() if method == "none"}


def test_command_writes_the_page_and_the_profile_for_given_completions(tiny_dir, tmp_path, capsys):
    out = tmp_path / "page.html"
    argv = ["explain", "--model", str(tiny_dir), "--method", "grail,entropy,none", "--prompt", "Q: 2+3\nA:",
            "--answer", "5", "--completion", " 2+3=5. \\boxed{5}", "--completion", " 2+3=6. \\boxed{6}",
            "--output", str(out), "--weight_max", "3.0"]
    assert main(argv) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    groups = by_completion(parse_page(page).tokens)
    assert "".join(t["text"] for t in groups[(0, 1, "grail")]) == " 2+3=6. \\boxed{6}"
    assert {float(t["data-weight"]) for t in groups[(0, 0, "grail")] if t["data-answer"] == "1"} == {3.0}  # the flag
    # scale_rewards=group (GRPOConfig's default for a model other than tiny): A = ±0.5 / (std 0.7071 + 1e-4)
    adv = _advantages(page)
    assert adv[(0, 0)] == pytest.approx(0.5 / (0.5 ** 0.5 + 1e-4), rel=1e-4) and adv[(0, 1)] == pytest.approx(
        -adv[(0, 0)], rel=1e-4)
    assert "math_verify_reward" in page and "weight_max=3.0" in page  # a --prompt: math_verify by default
    assert (tmp_path / "page_profile.png").is_file() or "matplotlib is not installed" in capsys.readouterr().out
    data = json.loads((tmp_path / "page.json").read_text())
    grail = data["methods"]["grail"]
    assert data["completions"] == 2 and sum(grail["correct"]["tokens"]) > 0 and sum(grail["wrong"]["tokens"]) > 0


def test_command_samples_and_uses_the_default_advantage_without_an_answer(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bare.html"
    assert main(["explain", "--model", str(tiny_dir), "--prompt", "Q: 1+1\nA:", "--samples", "2",
                 "--max_completion_length", "12", "--output", str(out), "--method", "grail,none"]) == 0
    page = out.read_text(encoding="utf-8")
    assert set(_advantages(page).values()) == {-1.0}
    assert "given: A = -1 for every completion" in page
    groups = by_completion(parse_page(page).tokens)
    assert {k[:2] for k in groups} == {(0, 0), (0, 1)}
    assert all(len(spans) <= 12 for spans in groups.values())  # the run's max_completion_length


def test_a_prompt_of_ones_own_is_graded_with_math_verify_unless_reward_says_otherwise(tiny_dir, tmp_path, capsys):
    """--prompt is a user's problem, not the synthetic task: a fraction as the answer is graded (exact_int, the
    synthetic task's reward, stopped on it); an explicit --reward still wins."""
    out = tmp_path / "frac.html"
    argv = ["explain", "--model", str(tiny_dir), "--method", "none", "--prompt", "What is 3/4?", "--answer",
            "\\frac{3}{4}", "--completion", " so \\boxed{0.75}", "--completion", " so \\boxed{3}", "--output", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert "math_verify_reward" in page and "reward 1, " in page and "reward 0, " in page
    assert main([*argv, "--reward", "exact_int"]) == 2
    assert "is not an integer" in capsys.readouterr().err


def test_mostly_empty_sampled_completions_get_one_warning_with_the_cause_and_the_fix(tiny_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    """A chat model given plain text often answers with its end-of-sequence token at once: the command says so."""
    import grail.analysis.explain.compute

    monkeypatch.setattr(grail.analysis.explain.compute, "sample_completions",
                        lambda model, tokenizer, prompt, params, seed: [[tokenizer.eos_token_id]] * params.n)
    assert main(["explain", "--model", str(tiny_dir), "--prompt", "What is 1+1?", "--samples", "2", "--method", "none",
                 "--output", str(tmp_path / "e.html")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count("warning:") == 1 and "2 of 2 sampled completions are empty" in out
    assert "prompt format" in out and "--conversational true" in out


def test_command_explains_synthetic_rows_with_the_warm_started_tiny_model(warm_cache, tmp_path, capsys):
    cache, _ = warm_cache
    out = tmp_path / "synthetic.html"
    assert main(["explain", "--model", "tiny", "--method", "grail,oar_g,entropy", "--dataset", "synthetic",
                 "--rows", "2", "--samples", "4", "--output", str(out), "--cache_dir", str(cache),
                 "--warmstart_steps", "200"]) == 0, capsys.readouterr().err
    assert "reusing cached checkpoint" in capsys.readouterr().out  # the session's warm start, not a new one
    page = out.read_text(encoding="utf-8")
    from grail.tasks.synthetic import SyntheticSet

    for row in SyntheticSet().rows("train")[:2]:
        assert f'<pre class="prompt">{row["prompt"]}</pre>' in page
    groups = by_completion(parse_page(page).tokens)
    assert {k for k in groups} == {(r, s, m) for r in (0, 1) for s in range(4) for m in ("grail", "oar_g", "entropy")}
    adv = {}
    for (row, sample, _), spans in groups.items():
        adv.setdefault(row, {})[sample] = float(spans[0]["data-adv"]) / float(spans[0]["data-weight"])
    for row in adv.values():  # tiny-cpu: scale_rewards=none, so each group's advantages sum to 0
        # (up to the page's rounding: Â and w are written with 6 significant digits, so each A read back as Â / w
        # is off by up to ~1e-6, and four of them summed can exceed 1e-6: 1.4e-6 here, at HEAD as well)
        assert sum(row.values()) == pytest.approx(0.0, abs=1e-5)
