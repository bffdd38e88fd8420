"""Every pure-torch zoo model: traced output == plain forward, stable labels, saved module outputs,
every saved value == what its call returned, the light capture.

The torchvision and Hugging Face zoo models run the same checks in tests/e2e.
"""

from __future__ import annotations

import pytest

from tests.models.zoo import PURE_CASES

from .zoo_checks import (
    check_labels_stable,
    check_light_capture_matches_trace,
    check_module_outputs_saved,
    check_output_equals_plain_forward,
    check_saved_values_equal_a_reference,
)

NAMES = sorted(PURE_CASES)


@pytest.mark.parametrize("name", NAMES)
def test_traced_output_equals_plain_forward(name):
    check_output_equals_plain_forward(PURE_CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_op_counts_and_labels_identical_across_traces(name):
    check_labels_stable(PURE_CASES[name])


@pytest.mark.parametrize("name", [n for n in NAMES if PURE_CASES[n].module_outputs])
def test_saved_activations_equal_module_outputs(name):
    check_module_outputs_saved(PURE_CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_light_capture_labels_and_keeps_what_a_trace_does(name):
    check_light_capture_matches_trace(PURE_CASES[name])


@pytest.mark.parametrize("name", NAMES)
def test_saved_values_equal_what_each_call_returned(name):
    check_saved_values_equal_a_reference(PURE_CASES[name])
