"""The sidecar judgement of env-injection: a container without gpu annotations is not fenced."""

from __future__ import annotations

from conformance.test_visibility import sidecar_problems
from workloads.simwire import SIM_TOKEN_ENV

FENCED = {"NVIDIA_GPU_MEMORY_LIMIT": "128", "NVIDIA_VISIBLE_DEVICES": "GPU-1", SIM_TOKEN_ENV: None}


def test_a_sidecar_with_nothing_of_the_fence_passes() -> None:
    assert sidecar_problems(FENCED, {"NVIDIA_GPU_MEMORY_LIMIT": None, "NVIDIA_VISIBLE_DEVICES": None}) == []


def test_an_images_own_default_is_not_the_fences() -> None:
    assert sidecar_problems(FENCED, {"NVIDIA_VISIBLE_DEVICES": "all"}) == []


def test_the_fences_values_or_a_device_token_in_the_sidecar_fail() -> None:
    got = sidecar_problems(FENCED, {"NVIDIA_GPU_MEMORY_LIMIT": "128", SIM_TOKEN_ENV: "abc"})
    assert len(got) == 2 and "NVIDIA_GPU_MEMORY_LIMIT='128'" in got[0] and SIM_TOKEN_ENV in got[1]


def test_a_sidecar_that_reported_nothing_is_a_problem() -> None:
    assert sidecar_problems(FENCED, None) == ["reported no environment (it did not run the plan)"]
