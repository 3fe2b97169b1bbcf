"""Classification mAP and F1, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wsss.evaluation.classification import average_precision, multilabel_scores


def test_average_precision_by_hand():
    # ranked: pos, neg, pos, neg -> precisions at the positives 1/1 and 2/3
    assert average_precision(np.array([0.9, 0.8, 0.7, 0.1]), np.array([1, 0, 1, 0])) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision(np.array([0.1, 0.2]), np.array([1, 0])) == pytest.approx(0.5)


def test_multilabel_scores_by_hand():
    probs = np.array([[0.9, 0.2, 0.6], [0.4, 0.8, 0.1], [0.7, 0.6, 0.3]])
    targets = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0]])  # class 2 has no positive: left out
    # class 0: ranked 0.9 (pos), 0.7, 0.4 -> AP 1; class 1: ranked 0.8 (pos), 0.6 (pos), 0.2 -> AP 1
    # F1 at 0.5: class 0 predicted on images 0 and 2, one true -> 2*1/(2+1); class 1 on 1 and 2, both true -> 1
    scores = multilabel_scores(probs, targets, 0.5)
    assert scores["cls_mAP"] == pytest.approx(100.0)
    assert scores["cls_F1"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    probs[0, 0] = 0.5  # now ranked 0.7 (neg), 0.5 (pos): AP 1/2; not predicted at 0.5: F1 0 for class 0
    scores = multilabel_scores(probs, targets, 0.5)
    assert scores["cls_mAP"] == pytest.approx(100 * (0.5 + 1) / 2)
    assert scores["cls_F1"] == pytest.approx(100 * (0 + 1) / 2)
    named = multilabel_scores(probs, targets, 0.5, names=["a", "b", "c"])
    assert named == {**scores, "AP_a": pytest.approx(50.0), "AP_b": pytest.approx(100.0)}  # "c": no positive


def test_no_positive_gives_nan():
    scores = multilabel_scores(np.zeros((2, 2)), np.zeros((2, 2)), 0.5)
    assert math.isnan(scores["cls_mAP"]) and math.isnan(scores["cls_F1"])


@pytest.mark.parametrize("absent", [0, 1], ids=["first", "middle"])
def test_each_ap_is_named_after_its_class_when_a_class_before_it_has_no_positive(absent):
    """The APs of the classes with a positive image keep their own names when an earlier class has none (a
    names-against-APs zip that skips no class would shift every name after it)."""
    probs = np.array([[0.9, 0.8, 0.3], [0.2, 0.7, 0.6], [0.4, 0.1, 0.8]])
    targets = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    targets[:, absent] = 0  # no val image of this class
    names = ["aero", "bike", "bird"]
    want = {}
    for k in range(3):  # by hand: class 0 ranks image 0 first (AP 1); class 1 ranks 0, 1 (AP 1/2); class 2: 2 (AP 1)
        if k != absent:
            want[f"AP_{names[k]}"] = pytest.approx(100 * (0.5 if k == 1 else 1.0))
    scores = multilabel_scores(probs, targets, 0.5, names=names)
    assert {k: v for k, v in scores.items() if k.startswith("AP_")} == want
    assert f"AP_{names[absent]}" not in scores
