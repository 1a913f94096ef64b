"""grail.analysis.saliency.label_logprobs: per-token log-probabilities in TRL's layout against the model's own full
logits, and the critical / contrast means of labelled rows against a per-row computation of their own."""

import math

import pytest
import torch
from tests.probe_batches import padded_rows, probe_model

from grail.analysis.saliency.label_logprobs import completion_logprobs_BT, label_logprobs
from grail.analysis.saliency.quality import SaliencyQualityOptions, teacher_forced_traces
from grail.analysis.saliency.token_labels import CRITICAL, FILLER, synthetic_rows
from grail.tasks.arithmetic import TaskConfig


@pytest.fixture(scope="module")
def model(tokenizer):
    return probe_model(tokenizer, max_positions=256)


def test_completion_logprobs_are_the_full_logits_log_softmax_at_the_predicting_position(model):
    ids, attn = padded_rows(6, 10, 0, [(0, 10), (2, 7), (1, 5)])
    got_BT = completion_logprobs_BT(model, ids, attn, 10, chunk_positions=7)  # chunks cut across rows
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
    for b, (_, completion) in enumerate([(0, 10), (2, 7), (1, 5)]):
        for t in range(10):
            if t < completion:
                want = torch.log_softmax(logits[b, 6 + t - 1], -1)[ids[b, 6 + t]]
                assert got_BT[b, t].item() == pytest.approx(want.item(), abs=1e-5)
            else:
                assert got_BT[b, t] == 0.0  # padding


def test_label_means_equal_a_row_by_row_computation_for_any_batch_size(model, tokenizer):
    rows = synthetic_rows(TaskConfig(filler_rate=0.6), 6, "heldout", 3)
    got = label_logprobs(model, tokenizer, rows, SaliencyQualityOptions(batch_size=4))
    traces = teacher_forced_traces(tokenizer, rows, SaliencyQualityOptions(traces="reference"))
    sums, counts = {CRITICAL: 0.0, FILLER: 0.0}, {CRITICAL: 0, FILLER: 0}
    for trace in traces:  # one unpadded row at a time, full logits
        ids = torch.tensor([trace.prompt_ids + trace.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        S = len(trace.prompt_ids)
        for t, label in enumerate(trace.labels):
            if label in sums:
                sums[label] += logp[S + t - 1, trace.completion_ids[t]].item()
                counts[label] += 1
    assert (got.n_critical, got.n_contrast) == (counts[CRITICAL], counts[FILLER])
    assert counts[CRITICAL] > 10 and counts[FILLER] > 10
    assert got.critical == pytest.approx(sums[CRITICAL] / counts[CRITICAL], abs=1e-5)
    assert got.contrast == pytest.approx(sums[FILLER] / counts[FILLER], abs=1e-5)
    assert got.critical != pytest.approx(got.contrast, abs=1e-3)  # the two classes are told apart
    one = label_logprobs(model, tokenizer, rows, SaliencyQualityOptions(batch_size=1))
    assert one.critical == pytest.approx(got.critical, abs=1e-5) and one.contrast == pytest.approx(got.contrast,
                                                                                                    abs=1e-5)
    assert got.as_metrics() == {"logp/critical": got.critical, "logp/contrast": got.contrast}
    assert all(math.isfinite(v) and v < 0 for v in got.as_metrics().values())
    assert model.training is False


def test_a_model_trained_towards_the_critical_tokens_raises_their_mean_more(model, tokenizer):
    """The measure reads an update: a few steps of likelihood on the critical tokens alone move logp/critical up by
    more than logp/contrast."""
    import copy

    rows = synthetic_rows(TaskConfig(filler_rate=0.6), 6, "heldout", 3)
    before = label_logprobs(model, tokenizer, rows)
    trained = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.5)
    traces = teacher_forced_traces(tokenizer, rows, SaliencyQualityOptions(traces="reference"))
    for _ in range(5):
        for trace in traces:
            ids = torch.tensor([trace.prompt_ids + trace.completion_ids])
            labels = torch.full_like(ids, -100)
            S = len(trace.prompt_ids)
            for t, label in enumerate(trace.labels):
                if label == CRITICAL:
                    labels[0, S + t] = ids[0, S + t]
            trained(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    after = label_logprobs(trained, tokenizer, rows)
    assert after.critical - before.critical > after.contrast - before.contrast + 0.1
    assert trained.training is True  # restored

