"""torchvision resnet18 and tiny GPT-2 / BERT through the same zoo checks as the pure models."""

from __future__ import annotations

import pytest

from tests.core.zoo_checks import (
    check_labels_stable,
    check_light_capture_matches_trace,
    check_module_outputs_saved,
    check_output_equals_plain_forward,
    check_saved_values_equal_a_reference,
)
from tests.models import CASES

NAMES = ["resnet18", "gpt2_tiny", "bert_tiny"]


@pytest.mark.parametrize("name", NAMES)
def test_traced_output_equals_plain_forward(name):
    check_output_equals_plain_forward(CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_labels_identical_across_traces(name):
    check_labels_stable(CASES[name])


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].module_outputs])
def test_saved_activations_equal_module_outputs(name):
    check_module_outputs_saved(CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_light_capture_labels_and_keeps_what_a_trace_does(name):
    check_light_capture_matches_trace(CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_saved_values_equal_what_each_call_returned(name):
    check_saved_values_equal_a_reference(CASES[name])
