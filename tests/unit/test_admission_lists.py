"""The plugin lists and config fields of the admission policy are the agent's: one source of truth, checked
both ways."""

from __future__ import annotations

import re

import yaml

from netclaim.core.config.cniconfig import KINDS, CNIConfig
from netclaim.core.config.tenancy import IPAM, PLUGINS
from netclaim.core.config.validate import ALLOWED_PLUGINS
from netclaim.core.ipam.ippool import AddressConfig
from netclaim_lab.layout import REPO_ROOT


def _variable(name: str) -> str:
    """The CEL expression of a variable of the netclaim-config policy in deploy/admission.yaml."""
    documents = list(yaml.safe_load_all((REPO_ROOT / "deploy" / "admission.yaml").read_text()))
    policy = next(
        d
        for d in documents
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "netclaim-config"
    )
    return str(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name))


def _admission_plugin_lists() -> tuple[set[str], set[str]]:
    """(DeviceClass list, claim list) from the allowedPlugins variable of deploy/admission.yaml."""
    expression = _variable("allowedPlugins")
    admin, tenant = (
        set(re.findall(r"'([a-z-]+)'", names)) for names in re.findall(r"\[([^\]]*)\]", expression)
    )
    return admin, tenant


def test_device_classes_may_use_what_netclaim_validate_allows() -> None:
    assert _admission_plugin_lists()[0] == set(ALLOWED_PLUGINS)


def test_claims_may_use_exactly_the_tenant_allow_list() -> None:
    assert _admission_plugin_lists()[1] == set(PLUGINS) | set(IPAM)


def _cel_map_of_maps(name: str) -> dict[str, set[str]]:
    """A variable of netclaim-config that is a CEL map of maps (name -> {key: type}), as name -> keys."""
    expression = _variable(name)
    return {
        outer: set(re.findall(r"'([A-Za-z-]+)':", inner))
        for outer, inner in re.findall(r"'([A-Za-z-]+)':\s*\{([^}]*)\}", expression)
    }


def test_claims_may_set_the_keys_the_agent_allows_in_the_same_spelling() -> None:
    assert _cel_map_of_maps("tenantTypes") == {kind: {"type", *fields} for kind, fields in PLUGINS.items()}
    assert _cel_map_of_maps("tenantIpamTypes") == {kind: set(fields) for kind, fields in IPAM.items()}


def test_address_configs_may_have_exactly_the_fields_the_agent_decodes() -> None:
    assert _cel_map_of_maps("fieldTypes")["AddressConfig"] == set(AddressConfig.__struct_fields__)


def test_cni_configs_may_have_the_fields_the_agent_decodes() -> None:
    """`pinned` and `devicesPerRequest` too, in a DeviceClass only (the variable classOnly)."""
    assert _cel_map_of_maps("fieldTypes")["CNIConfig"] == set(CNIConfig.__struct_fields__)
    assert set(re.findall(r"'([A-Za-z]+)'", _variable("classOnly"))) == {"pinned", "devicesPerRequest"}


def test_admission_knows_the_kinds_the_agent_decodes() -> None:
    assert set(_cel_map_of_maps("fieldTypes")) == set(KINDS)
