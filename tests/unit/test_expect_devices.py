"""The device-form judgements the checks share (``conformance.expect``): what form a gpus.devices
entry is in, and which entries are off the form a scheduler's description declares."""

from __future__ import annotations

import pytest

from conformance.expect import device_form, device_forms, devices_off_form

CDI_UUID = "k8s.device-plugin.nvidia.com/gpu=GPU-0fde8a95-5872-5c96-96ca-7751d577013c"
UUID = "GPU-0fde8a95-5872-5c96-96ca-7751d577013c"


@pytest.mark.parametrize(
    ("entry", "form"),
    [(UUID, "uuid"), ("MIG-1234", "uuid"), ("0", "index"), ("12", "index"), (CDI_UUID, "cdi"),
     ("k8s.device-plugin.nvidia.com/gpu=3", "cdi")],
)  # fmt: skip
def test_the_form_of_one_entry(entry: str, form: str) -> None:
    assert device_form(entry) == form


def test_the_forms_of_several_values() -> None:
    assert device_forms([f"{UUID},1", CDI_UUID, ""]) == {"uuid", "index", "cdi"}


def test_uuid_declared_takes_bare_and_cdi_uuids_and_refuses_indices() -> None:
    # KAI declares UUIDs and writes CDI names of them where the device plugin uses CDI
    assert devices_off_form(f"{UUID},{CDI_UUID}", "uuid") == []
    assert devices_off_form(f"0,{UUID},k8s.device-plugin.nvidia.com/gpu=1", "uuid") == [
        "0",
        "k8s.device-plugin.nvidia.com/gpu=1",
    ]


def test_index_and_cdi_declared() -> None:
    assert devices_off_form("0,k8s.device-plugin.nvidia.com/gpu=1", "index") == []
    assert devices_off_form(f"0,{UUID}", "index") == [UUID]
    assert devices_off_form(f"{CDI_UUID},{UUID},2", "cdi") == [UUID, "2"]
