"""The link settings (``link_*``, docs/tls.md#links-between-processes) as `Config.validate` checks them."""

from __future__ import annotations

import pytest

from idled.ops.config import Config, ConfigError

ELECTED = dict(election="etcd://127.0.0.1:2379/idled", advertise="10.0.0.1:7878")
TLS = dict(tls_cert="core.pem", tls_key="core.key")


@pytest.mark.parametrize("settings, message", [
    (dict(link_ca="ca.pem"), "link_ca needs link_tls"),
    (dict(link_server_name="cores.internal"), "link_server_name needs link_tls"),
    (dict(link_tls=True, link_cert="link.pem"), "link_cert and link_key go together"),
    (dict(link_tls=True, link_key="link.key"), "link_cert and link_key go together"),
    (dict(**ELECTED, **TLS), "an elected core that serves TLS (tls_cert) follows its leader over TLS: give link_tls"),
])
def test_a_link_setting_that_cannot_work_is_refused(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**settings).validate()  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize("settings", [
    dict(**ELECTED, **TLS, link_tls=True),
    dict(**ELECTED, link_tls=True),  # a plaintext pair may still dial over TLS (a TLS proxy in front)
    dict(standby_of="10.0.0.1:7878", **TLS),  # the active's TLS is not known here: the link finds out at start
    dict(link_tls=True, link_ca="ca.pem", link_server_name="cores.internal", link_cert="a.pem", link_key="a.key"),
])
def test_link_settings_that_can_work_are_accepted(settings: dict) -> None:
    Config(**settings).validate()  # type: ignore[arg-type]
