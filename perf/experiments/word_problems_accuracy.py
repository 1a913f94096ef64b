r"""Sampled and greedy accuracy of a chat model on the word-problem style of the synthetic task
(grail.tasks.word_problems).

Renders held-out problems (chat messages: worked examples as earlier turns, then the problem) through the model's
chat template (add_generation_prompt), samples at --temperature (default 1.0; top-p 1, top-k 0: as TRL's GRPO samples by
default), grades the last \boxed{} as an integer (grail.evaluation.rewards.exact_int_reward, the reward `auto` picks for
the synthetic task) and prints: sampled accuracy with a 95% CI (grail.evaluation.bootstrap over problems, the
samples of a problem staying together), greedy accuracy, the share of completions with no complete \boxed{}, the share
that stopped (end-of-sequence before --max-new-tokens) and the mean completion length in tokens. Used to choose the word
style's defaults so that sampled accuracy before RL is 20-60% (GRPO groups with mixed rewards):

    python perf/experiments/word_problems_accuracy.py [--model smollm2-135m] [--n-problems 64] [--samples 4] \
        [--max-new-tokens 128] [--num-steps 1] [--operand-max 20] [--max-value 40] [--shots 4] \
        [--instruction default|none|TEXT] [--suffix TEXT|paper] [--format auto|chat|plain] \
        [--answer-end none|eos|TEXT] [--split heldout|train] [--threads 2] [--json PATH] [--dump PATH]

A base model without a chat template (Gemma 3 270M) gets the plain rendering (grail.options.prompts.render_plain), by
default exactly as a run renders it (--answer-end none). It tends to write on past its answer (a next "Question:"),
so the script also prints the share of completions that did, and, as a diagnostic only, the share whose FIRST box
holds the answer (the reward and the evaluation read the last one).

The task options default to grail.tasks.word_problems.WORDS_TASK and its prompt (--shots 4, --instruction default, no
suffix); the results are recorded in grail.tasks.word_problems' docstring. Each prompt is run once and its cache shared
by its samples. --threads: torch.set_num_threads; on a CPU shared with other processes 1 thread was ~5x faster than 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grail.evaluation.bootstrap import bootstrap_intervals
from grail.evaluation.rewards import exact_int_reward
from grail.models.warmstart import resolve_model
from grail.options.prompts import PLAIN_USER, has_chat_template, plain_prefix, render_plain, resolve_suffix
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.boxed import first_boxed, last_boxed_content
from grail.tasks.synthetic import generate
from grail.tasks.word_problems import INSTRUCTION, WORDS_TASK, PromptOptions


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m",
                   help="a built-in real model name (`grail models list`), a save_pretrained directory or a Hub id")
    p.add_argument("--n-problems", type=int, default=64)
    p.add_argument("--samples", type=int, default=4, help="sampled completions per problem (at --temperature)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature, as a run's `temperature` (its rollouts and its sampled evaluation)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate call")
    p.add_argument("--num-steps", type=int, default=WORDS_TASK.num_steps)
    p.add_argument("--operand-min", type=int, default=WORDS_TASK.operand_min)
    p.add_argument("--operand-max", type=int, default=WORDS_TASK.operand_max)
    p.add_argument("--max-value", type=int, default=WORDS_TASK.max_value)
    p.add_argument("--filler-rate", type=float, default=0.0)
    p.add_argument("--shots", type=int, default=PromptOptions.shots, help="worked examples in the prompt")
    p.add_argument("--instruction", default="default",
                   help=f"text after the question: default ({INSTRUCTION!r}), none, or any text")
    p.add_argument("--suffix", default="",
                   help="appended to the user message, as a run's prompt_suffix: text, or `paper` / `release` "
                   "(grail.options.prompts.resolve_suffix)")
    p.add_argument("--format", default="auto", choices=("auto", "chat", "plain"),
                   help="chat: the model's chat template; plain: grail.options.prompts.render_plain (for a base model "
                   "without a template); auto: chat iff the tokenizer has a template")
    p.add_argument("--answer-end", default="none",
                   help="plain format: text closing each worked answer: none (as training renders the prompt, "
                   "grail.options.prompts.PromptFormat), eos (the tokenizer's EOS token), or any text")
    p.add_argument("--split", default="heldout", choices=("train", "heldout"))
    p.add_argument("--task-seed", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy pass")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--show", type=int, default=2, help="print this many sampled completions")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--dump", help="write every sampled completion here (JSON lines: expression, answer, completion, "
                   "reward)")
    return p.parse_args(argv)


def _generate(model, tokenizer, texts: list[str], n: int, sample: bool,
              max_new_tokens: int, temperature: float = 1.0) -> list[tuple[str, int, bool]]:
    """(completion text, completion tokens, stopped) for each text, n per text (grouped by text)."""
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    kwargs = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    with torch.no_grad():
        if n > 1:  # run each prompt once (all but its last token) and share that cache among its n samples
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate derives them
            cache = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                          use_cache=True).past_key_values
            cache.batch_repeat_interleave(n)
            ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
            kwargs["past_key_values"] = cache
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    results = []
    for row in out[:, ids.shape[1]:].tolist():
        stop = next((i for i, t in enumerate(row) if t == tokenizer.eos_token_id), None)
        ids = row if stop is None else row[:stop]
        stopped = stop is not None  # the end-of-sequence token counts as a completion token
        results.append((tokenizer.decode(ids, skip_special_tokens=True), len(ids) + stopped, stopped))
    return results


def _first_box_correct(completion: str, answer: str) -> float:
    """1.0 iff the completion's first complete box holds the integer answer (exact_int's rule on the first box)."""
    span = first_boxed(completion)
    return exact_int_reward(["" if span is None else completion[:span.end]], answer=[answer])[0]  # its last box


def _with_suffix(messages: list[dict], suffix: str) -> list[dict]:
    """The problem's chat messages with `suffix` appended to the last user turn (as a run's prompt_suffix)."""
    messages = [dict(m) for m in messages]
    messages[-1]["content"] += suffix
    return messages


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    instruction = {"default": INSTRUCTION, "none": ""}.get(args.instruction, args.instruction)
    suffix = resolve_suffix(args.suffix)
    task = TaskConfig(num_steps=args.num_steps, operand_min=args.operand_min, operand_max=args.operand_max,
                      max_value=args.max_value, filler_rate=args.filler_rate, style="words")
    examples = generate(task, args.n_problems, args.split, args.task_seed,
                        word_prompt=PromptOptions(shots=args.shots, instruction=instruction))
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chat = has_chat_template(tokenizer) if args.format == "auto" else args.format == "chat"
    answer_end = {"eos": tokenizer.eos_token, "none": ""}.get(args.answer_end, args.answer_end)
    if chat:
        texts = [tokenizer.apply_chat_template(_with_suffix(e.prompt, suffix), add_generation_prompt=True,
                                               tokenize=False) for e in examples]
    else:  # as TRL tokenises plain text: with the tokenizer's special tokens (a BOS token where it adds one)
        texts = [plain_prefix(tokenizer) + render_plain(_with_suffix(e.prompt, suffix), answer_end) for e in examples]
    answers = [e.answer for e in examples]
    torch.manual_seed(args.seed)
    started = time.time()
    per_call = max(1, args.batch_size // args.samples)
    sampled = []
    for i in range(0, len(texts), per_call):
        sampled += _generate(model, tokenizer, texts[i:i + per_call], args.samples, True, args.max_new_tokens,
                             args.temperature)
        print(f"  sampled {min(i + per_call, len(texts))}/{len(texts)} problems ({time.time() - started:.0f} s)",
              file=sys.stderr)
    completions = [c for c, _, _ in sampled]
    rewards = exact_int_reward(completions, answer=[a for a in answers for _ in range(args.samples)])
    per_problem = [statistics.fmean(rewards[i * args.samples:(i + 1) * args.samples]) for i in range(len(answers))]
    by_operators: dict[str, list[float]] = {}
    for example, accuracy in zip(examples, per_problem, strict=True):
        by_operators.setdefault("".join(c for c in example.expression if c in "+-*"), []).append(accuracy)
    if args.dump:
        with open(args.dump, "w") as f:
            for i, (completion, reward) in enumerate(zip(completions, rewards, strict=True)):
                example = examples[i // args.samples]
                f.write(json.dumps({"expression": example.expression, "answer": example.answer,
                                    "completion": completion, "reward": reward}) + "\n")
    low, high = bootstrap_intervals([per_problem], resamples=2000, level=0.95, seed=0)[0]
    result = {
        "model": args.model, "task": {k: getattr(task, k) for k in ("num_steps", "operand_min", "operand_max",
                                                                    "max_value", "filler_rate", "style")},
        "prompt": {"shots": args.shots, "instruction": instruction, "suffix": suffix,
                   "format": "chat" if chat else "plain", "answer_end": "" if chat else answer_end},
        "split": args.split, "n_problems": len(answers), "samples": args.samples,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "sampled_accuracy": statistics.fmean(rewards), "sampled_ci95": [low, high],
        "problems_mixed": sum(0 < p < 1 for p in per_problem) / len(per_problem),
        "by_operators": {ops: {"problems": len(v), "sampled_accuracy": statistics.fmean(v)}
                         for ops, v in sorted(by_operators.items())},
        "no_box_share": sum(last_boxed_content(c) is None for c in completions) / len(completions),
        # a diagnostic, not the reward: the share whose FIRST box holds the answer (a base model that writes on past
        # its answer can box something else later; the reward and the evaluation read the last box)
        "first_box_accuracy": statistics.fmean(_first_box_correct(c, a) for c, a in
                                               zip(completions, [a for a in answers for _ in range(args.samples)],
                                                   strict=True)),
        "next_question_share": sum(PLAIN_USER in c for c in completions) / len(completions),
        "stopped_share": sum(s for _, _, s in sampled) / len(sampled),
        "mean_completion_tokens": statistics.fmean(n for _, n, _ in sampled),
        "prompt_tokens_mean": statistics.fmean(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts),
    }
    if not args.no_greedy:
        greedy = []
        for i in range(0, len(texts), args.batch_size):
            greedy += _generate(model, tokenizer, texts[i:i + args.batch_size], 1, False, args.max_new_tokens)
        result["greedy_accuracy"] = statistics.fmean(exact_int_reward([c for c, _, _ in greedy], answer=answers))
        result["greedy_no_box_share"] = sum(last_boxed_content(c) is None for c, _, _ in greedy) / len(greedy)
    result["seconds"] = round(time.time() - started)
    result["examples"] = [{"prompt": examples[i // args.samples].prompt, "answer": answers[i // args.samples],
                           "completion": completions[i]} for i in range(min(args.show, len(completions)))]
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    for example in result["examples"]:
        print(f"--- answer {example['answer']}:\n{example['completion']}")
    low, high = result["sampled_ci95"]
    greedy = f"{result['greedy_accuracy']:.1%}" if "greedy_accuracy" in result else "skipped"
    print(f"{result['task']} prompt {result['prompt']}")
    print(f"sampled accuracy (T={result['temperature']}, {result['n_problems']} problems x {result['samples']}): "
          f"{result['sampled_accuracy']:.1%} [95% CI {low:.1%}, {high:.1%}]; greedy {greedy}; "
          f"problems with mixed rewards {result['problems_mixed']:.0%}; no box {result['no_box_share']:.1%}; "
          f"stopped {result['stopped_share']:.1%}; first box correct {result['first_box_accuracy']:.1%}; "
          f"went on to a next question {result['next_question_share']:.0%}; "
          f"mean completion {result['mean_completion_tokens']:.1f} tokens; "
          f"prompt {result['prompt_tokens_mean']:.0f} tokens; {result['seconds']} s")
    print("sampled accuracy by operators: " + ", ".join(
        f"{ops} {v['sampled_accuracy']:.1%} ({v['problems']} problems)" for ops, v in result["by_operators"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
