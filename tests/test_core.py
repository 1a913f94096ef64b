"""grail.core: token advantages and their invariants."""

import pytest
import torch

from grail.core import advantage_scale_ratio, masked_mean, token_advantages, uniform_weights


def _mask():
    return torch.tensor([[True, True, True, False], [True, False, False, False]])


def test_uniform_weights_are_one_on_real_tokens_and_zero_on_padding():
    w = uniform_weights(_mask())
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert w.dtype == torch.float32


def test_token_advantages_broadcast_and_keep_sign():
    adv_B = torch.tensor([0.5, -2.0])
    weights_BT = torch.tensor([[1.0, 2.0, 0.5, 0.0], [3.0, 0.0, 0.0, 0.0]])
    adv_BT = token_advantages(adv_B, weights_BT)
    assert adv_BT.tolist() == [[0.5, 1.0, 0.25, 0.0], [-6.0, 0.0, 0.0, 0.0]]
    positive = weights_BT > 0
    assert torch.equal(torch.sign(adv_BT)[positive], torch.sign(adv_B)[:, None].expand_as(adv_BT)[positive])


def test_weights_are_constants_in_the_loss():
    weights_BT = torch.ones(2, 3, requires_grad=True)
    adv_BT = token_advantages(torch.tensor([1.0, -1.0]), weights_BT * 2)
    assert not adv_BT.requires_grad


def test_token_advantages_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(B,\) and weights \(B, T\)"):
        token_advantages(torch.zeros(3), torch.ones(2, 4))


def test_uniform_weights_give_scale_ratio_one_and_weighted_ones_the_ratio_of_means():
    mask, adv_B = _mask(), torch.tensor([1.0, -3.0])
    uniform = token_advantages(adv_B, uniform_weights(mask))
    assert advantage_scale_ratio(adv_B, uniform, mask).item() == pytest.approx(1.0)
    weights = torch.tensor([[2.0, 2.0, 2.0, 9.0], [1.0, 9.0, 9.0, 9.0]])
    # sum|Â| over real tokens = 3*2*1 + 1*1*3 = 9; sum|A| over the same tokens = 3*1 + 1*3 = 6.
    ratio = advantage_scale_ratio(adv_B, token_advantages(adv_B, weights), mask)
    assert ratio.item() == pytest.approx(9 / 6)


def test_scale_ratio_is_one_without_signal_and_masked_mean_of_empty_is_zero():
    mask = _mask()
    zero = torch.zeros(2)
    assert advantage_scale_ratio(zero, token_advantages(zero, uniform_weights(mask)), mask).item() == 1.0
    assert masked_mean(torch.ones(2, 4), torch.zeros(2, 4, dtype=torch.bool)).item() == 0.0
    assert masked_mean(torch.arange(8.0).reshape(2, 4), mask).item() == pytest.approx((0 + 1 + 2 + 4) / 4)
