"""The generated DRA and plugin-registration stubs keep kubelet's wire format: paths, field numbers."""

from __future__ import annotations

from gpuledger_proto import pluginregistration as reg
from gpuledger_proto import v1alpha1 as health
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from gpuledger_proto.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_beta


def test_service_paths_are_kubelets() -> None:
    assert set(reg.RegistrationBase().__mapping__()) == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }
    for package, name in ((dra, "v1"), (dra_beta, "v1beta1")):
        assert set(package.DraPluginBase().__mapping__()) == {
            f"/k8s.io.kubelet.pkg.apis.dra.{name}.DRAPlugin/NodePrepareResources",
            f"/k8s.io.kubelet.pkg.apis.dra.{name}.DRAPlugin/NodeUnprepareResources",
        }
    assert set(health.DraResourceHealthBase().__mapping__()) == {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}


def test_plugin_info_field_numbers() -> None:
    info = reg.PluginInfo(type="T", name="n", endpoint="/e", supported_versions=["a", "b"])
    assert bytes(info) == b"\x0a\x01T\x12\x01n\x1a\x02/e\x22\x01a\x22\x01b"
    assert bytes(reg.RegistrationStatus(plugin_registered=True, error="x")) == b"\x08\x01\x12\x01x"


def test_claim_and_device_field_numbers() -> None:
    assert bytes(dra.Claim(namespace="ns", uid="u", name="c")) == b"\x0a\x02ns\x12\x01u\x1a\x01c"
    device = dra.Device(request_names=["r"], pool_name="p", device_name="d", cdi_device_ids=["k=i"], share_id="s")
    assert bytes(device) == b"\x0a\x01r\x12\x01p\x1a\x01d\x22\x03k=i\x2a\x01s"
    # share_id is proto3 optional: absent is not the empty string, and v1beta1 has no field 5.
    assert bytes(dra.Device(device_name="d")) == b"\x1a\x01d"
    assert bytes(dra.Device(device_name="d", share_id="")) == b"\x1a\x01d\x2a\x00"
    assert "share_id" not in dra_beta.Device.__dataclass_fields__


def test_responses_are_maps_by_claim_uid() -> None:
    answer = dra.NodePrepareResourcesResponse(claims={"u": dra.NodePrepareResourceResponse(error="e")})
    assert bytes(answer) == b"\x0a\x08\x0a\x01u\x12\x03\x12\x01e"
    parsed = dra.NodeUnprepareResourcesResponse().parse(b"\x0a\x08\x0a\x01u\x12\x03\x0a\x01e")
    assert parsed.claims["u"].error == "e"


def test_device_health_field_numbers() -> None:
    device = health.DeviceHealth(
        device=health.DeviceIdentifier(pool_name="p", device_name="d"),
        health=health.HealthStatus.UNHEALTHY,
        last_updated_time=1,
        health_check_timeout_seconds=30,
        message="m",
    )
    assert bytes(device) == b"\x0a\x06\x0a\x01p\x12\x01d\x10\x02\x18\x01\x20\x1e\x2a\x01m"
    assert bytes(health.NodeWatchResourcesResponse(devices=[device])) == b"\x0a\x11" + bytes(device)
    assert [int(s) for s in health.HealthStatus] == [0, 1, 2]  # UNKNOWN, HEALTHY, UNHEALTHY
