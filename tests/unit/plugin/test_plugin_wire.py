"""The generated kubelet stubs keep kubelet's wire format: paths, field numbers, names."""

from __future__ import annotations

from gpuledger_proto import v1 as podresources
from gpuledger_proto import v1beta1 as dp


def test_device_plugin_paths_use_package_v1beta1() -> None:
    paths = set(dp.DevicePluginBase().__mapping__())
    assert paths == {
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    assert set(dp.RegistrationBase().__mapping__()) == {"/v1beta1.Registration/Register"}


def test_pod_resources_paths_use_package_v1() -> None:
    assert set(podresources.PodResourcesListerBase().__mapping__()) == {
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    }


def test_preferred_request_field_numbers() -> None:
    # available_deviceIDs = 1, must_include_deviceIDs = 2, allocation_size = 3
    message = dp.ContainerPreferredAllocationRequest(
        available_device_i_ds=["a"], must_include_device_i_ds=["b"], allocation_size=2
    )
    assert bytes(message) == b"\x0a\x01a\x12\x01b\x18\x02"
    assert bytes(dp.ContainerPreferredAllocationResponse(device_i_ds=["x"])) == b"\x0a\x01x"


def test_device_and_numa_field_numbers() -> None:
    device = dp.Device(id="g", health="Healthy", topology=dp.TopologyInfo([dp.NumaNode(id=1)]))
    assert bytes(device) == b"\x0a\x01g\x12\x07Healthy\x1a\x04\x0a\x02\x08\x01"


def test_register_request_field_numbers() -> None:
    request = dp.RegisterRequest(
        version="v1beta1",
        endpoint="s",
        resource_name="r",
        options=dp.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    assert bytes(request) == b"\x0a\x07v1beta1\x12\x01s\x1a\x01r\x22\x02\x10\x01"


def test_allocate_response_maps_and_cdi_devices() -> None:
    response = dp.ContainerAllocateResponse(
        envs={"K": "V"}, cdi_devices=[dp.CdiDevice(name="n")], annotations={"a": "b"}
    )
    raw = bytes(response)
    assert b"\x0a\x06\x0a\x01K\x12\x01V" in raw  # field 1: map entry {key=1, value=2}
    assert b"\x22\x06\x0a\x01a\x12\x01b" in raw  # field 4: annotations
    assert raw.endswith(b"\x2a\x03\x0a\x01n")  # field 5: cdi_devices
    assert bytes(dp.ContainerAllocateRequest(devices_ids=["d"])) == b"\x0a\x01d"


def test_pod_resources_field_numbers() -> None:
    devices = podresources.ContainerDevices(resource_name="r", device_ids=["d"])
    assert bytes(devices) == b"\x0a\x01r\x12\x01d"
    pod = podresources.PodResources(
        name="p", namespace="n", containers=[podresources.ContainerResources(name="c")]
    )
    assert bytes(pod) == b"\x0a\x01p\x12\x01n\x1a\x03\x0a\x01c"
