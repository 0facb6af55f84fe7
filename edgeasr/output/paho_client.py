"""The paho-mqtt client as mqtt.* describes it: credentials, TLS, last will, limits.

With edgeasr.output.mqtt, the only modules that import paho.
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeasr.errors import ConfigError, MissingInputError, ToolMissingError
from edgeasr.output.connection_reasons import Endpoint

if TYPE_CHECKING:
    from edgeasr.config import MqttConfig

log = logging.getLogger(__name__)


def use_tls(options: MqttConfig) -> bool:
    """mqtt.tls.enabled, where null means "when mqtt.tls.ca is set"."""
    tls = options.tls
    return tls.enabled if tls.enabled is not None else tls.ca is not None


def read_password(path: Path) -> str:
    """mqtt.password_file's content without its final newline (config.py has already
    looked a relative name up in $CREDENTIALS_DIRECTORY).  Never logged."""
    try:
        text = path.read_text("utf-8")
        mode = path.stat().st_mode
    except OSError as exc:
        raise MissingInputError(f"mqtt.password_file: cannot read {path}: {exc.strerror or exc}") from exc
    if mode & stat.S_IROTH:  # still used: refusing would take the daemon down over a file mode
        log.warning(
            "mqtt.password_file: %s is readable by every user on this machine (%s); restrict it: chmod 600 %s",
            path,
            stat.filemode(mode),
            path,
        )
    password = text.rstrip("\r\n")
    if not password:
        raise ConfigError(f"mqtt.password_file: {path} is empty")
    return password


def import_paho() -> Any:
    try:
        import paho.mqtt.client as mqtt_client
    except ImportError as exc:
        raise ToolMissingError("paho-mqtt is not installed (pip install 'paho-mqtt>=2.2')") from exc
    if not hasattr(mqtt_client.Client, "drop_out_messages"):
        raise ToolMissingError("paho-mqtt 2.2 or newer is needed (pip install -U 'paho-mqtt>=2.2')")
    return mqtt_client


def make_client(options: MqttConfig, client_id: str, *, will_topic: str, will: str, max_queued: int) -> Any:
    """A configured MQTT v5 client (callbacks not set); ConfigError/MissingInputError here."""
    mqtt = import_paho()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.reconnect_delay_set(options.reconnect_min_s, options.reconnect_max_s)
    client.max_queued_messages_set(max_queued)
    client.will_set(will_topic, will, qos=1, retain=True)
    # an exception in one of our callbacks is logged, not raised: raising would end paho's
    # network thread, and with it every later reconnect
    client.suppress_exceptions = True
    client.on_log = _paho_log
    if options.password_file is not None and not options.username:
        raise ConfigError("mqtt.password_file: set, but mqtt.username is not")
    if options.username:
        password = read_password(options.password_file) if options.password_file else None
        client.username_pw_set(options.username, password)
    if use_tls(options):
        _set_tls(client, options)
    return client


_paho_logger = logging.getLogger(__name__ + ".paho")


def _paho_log(client: Any, userdata: Any, level: int, text: str) -> None:
    """paho's own messages at DEBUG (its ERROR "Client is not connected" comes with every
    failed reconnect, which the publisher already explains), except an exception it
    caught in one of our callbacks."""
    _paho_logger.log(logging.ERROR if text.startswith("Caught exception") else logging.DEBUG, "paho: %s", text)


def endpoint(options: MqttConfig, client: Any) -> Endpoint:
    assert options.host is not None  # MqttPublisher checks it first
    return Endpoint(
        host=options.host,
        port=options.port,
        tls=use_tls(options),
        ca=options.tls.ca,
        username=options.username,
        keepalive_s=options.keepalive_s,
        connect_timeout_s=client.connect_timeout,
    )


def _set_tls(client: Any, options: MqttConfig) -> None:
    tls = options.tls
    for key, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
        if path is not None and not path.is_file():
            raise MissingInputError(f"mqtt.tls.{key}: {path} does not exist")
    if (tls.cert is None) != (tls.key is None):
        raise ConfigError("mqtt.tls.cert: mqtt.tls.cert and mqtt.tls.key go together")
    try:
        client.tls_set(
            ca_certs=_opt_str(tls.ca),
            certfile=_opt_str(tls.cert),
            keyfile=_opt_str(tls.key),
            tls_version=ssl.PROTOCOL_TLS_CLIENT,
        )
    except (ssl.SSLError, OSError) as exc:  # not a certificate, a key that does not match, ...
        raise ConfigError(f"mqtt.tls: cannot load {_opt_str(tls.ca)}, {_opt_str(tls.cert)}, "
                          f"{_opt_str(tls.key)}: {exc}") from exc


def _opt_str(path: Path | None) -> str | None:
    return None if path is None else str(path)
