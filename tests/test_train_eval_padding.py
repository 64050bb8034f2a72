"""Evaluation metrics on padded batches: only the real rows (and their counted pixels) count.

The metrics weigh padding rows (``valid`` false) out on the device instead of indexing them out
(a boolean index makes the host wait for the GPU; see ``test_train_gpu_hygiene.py``). These tests
check the image, clip, segmentation and depth metrics against sums written out here over the real
rows alone; padding rows hold values the old indexing never read (NaN logits, labels past the
classes), which must not reach the results either.
"""

from __future__ import annotations

import math

import pytest
import torch

from gpufeed.train._dense import DepthMetrics, DepthTask, SegmentationMetrics, SegmentationTask
from gpufeed.train._tasks import Accuracy, MultiLabelF1

pytestmark = pytest.mark.timeout(120)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_accuracy_of_padded_batches_counts_the_real_rows_only():
    metric = Accuracy()
    expected_correct, expected_loss, rows = 0, 0.0, 0
    for seed, valid in ((0, [True, True, False, True, False, True]), (1, [False, True, True, True, True, False])):
        logits = torch.randn(6, 5, generator=_generator(seed))
        targets = torch.randint(0, 5, (6,), generator=_generator(seed + 10))
        valid_t = torch.tensor(valid)
        # Padding rows may hold anything: a label past the classes, a NaN logit.
        logits[~valid_t] = float("nan")
        targets[~valid_t] = 99
        metric.update(logits, targets, valid_t)
        for row in range(6):
            if valid[row]:
                scores = logits[row].double()
                expected_correct += int(int(scores.argmax()) == int(targets[row]))
                expected_loss += float(torch.logsumexp(scores, 0) - scores[targets[row]])
                rows += 1
    result = metric.compute()
    assert result["samples"] == rows == 8
    assert result["accuracy"] == expected_correct / rows
    assert result["loss"] == pytest.approx(expected_loss / rows, rel=1e-6)


def test_an_all_padding_batch_adds_nothing_to_the_accuracy():
    metric = Accuracy()
    metric.update(torch.randn(3, 4), torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.bool))
    assert metric.compute() == {"samples": 0, "loss": None, "accuracy": None}


def _bce(x: float, y: float) -> float:
    return max(x, 0.0) - x * y + math.log1p(math.exp(-abs(x)))


def test_multilabel_f1_of_padded_batches_counts_the_real_rows_only():
    classes = 4
    metric = MultiLabelF1(classes, ("a", "b", "c", "d"))
    tp, fp, fn = [0] * classes, [0] * classes, [0] * classes
    loss_sum, rows = 0.0, 0
    for seed, valid in ((2, [True, False, True, True, False]), (3, [True, True, False, True, True])):
        logits = torch.randn(5, classes, generator=_generator(seed)) * 2
        targets = (torch.rand(5, classes, generator=_generator(seed + 10)) > 0.5).float()
        valid_t = torch.tensor(valid)
        logits[~valid_t] = float("nan")
        targets[~valid_t] = 7.0
        metric.update(logits, targets, valid_t)
        for row in range(5):
            if not valid[row]:
                continue
            rows += 1
            loss_sum += sum(_bce(float(logits[row, k]), float(targets[row, k])) for k in range(classes)) / classes
            for k in range(classes):
                predicted, actual = float(logits[row, k]) > 0, float(targets[row, k]) > 0.5
                tp[k] += predicted and actual
                fp[k] += predicted and not actual
                fn[k] += actual and not predicted
    f1 = {
        name: 2 * tp[k] / (2 * tp[k] + fp[k] + fn[k]) if 2 * tp[k] + fp[k] + fn[k] else None
        for k, name in enumerate("abcd")
    }
    defined = [v for v in f1.values() if v is not None]
    result = metric.compute()
    assert result["samples"] == rows == 7
    assert result["f1"] == pytest.approx(f1)
    assert result["macro_f1"] == pytest.approx(sum(defined) / len(defined))
    assert result["loss"] == pytest.approx(loss_sum / rows, rel=1e-6)


def test_segmentation_metrics_of_padded_batches_count_the_real_pixels_only():
    k, ignore = 3, 255
    task = SegmentationTask(k, ignore_id=ignore)
    metric = SegmentationMetrics(task)
    confusion = [[0] * k for _ in range(k)]
    loss_sum, samples = 0.0, 0
    for seed, valid in ((4, [True, False, True, True]), (5, [False, True, True, False])):
        logits = torch.randn(4, k, 5, 6, generator=_generator(seed))
        targets = torch.randint(0, k, (4, 5, 6), generator=_generator(seed + 10))
        targets[:, 0, :2] = ignore
        valid_t = torch.tensor(valid)
        metric.update(logits, targets, valid_t)
        for n in range(4):
            if not valid[n]:
                continue
            samples += 1
            for y in range(5):
                for x in range(6):
                    target = int(targets[n, y, x])
                    if target == ignore:
                        continue
                    scores = logits[n, :, y, x].double()
                    confusion[target][int(scores.argmax())] += 1
                    loss_sum += float(torch.logsumexp(scores, 0) - scores[target])
    pixels = sum(map(sum, confusion))
    iou = {}
    for c in range(k):
        union = sum(confusion[c]) + sum(row[c] for row in confusion) - confusion[c][c]
        iou[str(c)] = confusion[c][c] / union if union else None
    defined = [v for v in iou.values() if v is not None]
    result = metric.compute()
    assert (result["samples"], result["pixels"]) == (samples, pixels) == (5, 5 * 28)
    assert result["iou"] == pytest.approx(iou)
    assert result["miou"] == pytest.approx(sum(defined) / len(defined))
    assert result["pixel_accuracy"] == pytest.approx(sum(confusion[c][c] for c in range(k)) / pixels)
    assert result["loss"] == pytest.approx(loss_sum / pixels, rel=1e-6)


def test_depth_metrics_of_padded_batches_count_the_real_pixels_only():
    task = DepthTask(depth_scale=0.001, no_data=0)
    metric = DepthMetrics(task)
    sums = {"pixels": 0, "rel": 0.0, "sq": 0.0, "within": 0, "abs": 0.0}
    samples = 0
    for seed, valid in ((6, [True, False, True]), (7, [True, True, False])):
        logits = torch.rand(3, 1, 4, 5, generator=_generator(seed)) * 3
        targets = torch.randint(0, 3000, (3, 4, 5), generator=_generator(seed + 10))
        targets[:, 0, :3] = 0  # no data
        metric.update(logits, targets, torch.tensor(valid))
        for n in range(3):
            if not valid[n]:
                continue
            samples += 1
            for y in range(4):
                for x in range(5):
                    if int(targets[n, y, x]) == 0:
                        continue
                    truth, guess = float(targets[n, y, x].float() * 0.001), float(logits[n, 0, y, x])
                    sums["pixels"] += 1
                    sums["rel"] += abs(guess - truth) / truth
                    sums["sq"] += (guess - truth) ** 2
                    sums["abs"] += abs(guess - truth)
                    sums["within"] += max(max(guess, 1e-6) / truth, truth / max(guess, 1e-6)) < 1.25
    pixels = sums["pixels"]
    result = metric.compute()
    assert (result["samples"], result["pixels"]) == (samples, pixels) == (4, 4 * 17)
    assert result["abs_rel"] == pytest.approx(sums["rel"] / pixels, rel=1e-5)
    assert result["rmse"] == pytest.approx(math.sqrt(sums["sq"] / pixels), rel=1e-5)
    assert result["delta1"] == pytest.approx(sums["within"] / pixels)
    assert result["loss"] == pytest.approx(sums["abs"] / pixels, rel=1e-5)
