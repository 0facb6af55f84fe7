"""Home Assistant Supervisor's rules for an add-on repository, written again here from its
sources (home-assistant/supervisor: store/data.py, store/repository.py, store/validate.py,
addons/validate.py, addons/options.py, validate.py) with the library it uses, voluptuous, so
that the add-on's files are checked as the Supervisor checks them:

- a repository added by URL is valid when `repository.yaml` (or .yml/.json) at its root has a
  `name` (store/repository.py); its add-ons are every `config.yaml|yml|json` below the root
  whose path has no part starting with "." and no `rootfs` (store/data.py);
- an add-on's config passes SCHEMA_ADDON_CONFIG, each of its `schema` values is one of the
  types RE_SCHEMA_ELEMENT parses, and build.yaml passes SCHEMA_BUILD_CONFIG;
- before every start, the options pass the add-on's schema (AddonOptions): an option not in the
  schema is dropped with a warning, a missing one is an error unless its type ends in "?", and
  each value is coerced and checked by its type.

The Supervisor drops keys its config schema does not know (REMOVE_EXTRA); here they are
errors, so that a misspelt key cannot pass unseen. Only the types and keys this add-on uses
are written again.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import voluptuous as vol

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")  # FILE_SUFFIX_CONFIGURATION
ARCHITECTURES = ("armhf", "armv7", "aarch64", "amd64", "i386")  # ARCH_ALL
SLUG = re.compile(r"[-_.A-Za-z0-9]+")
VOLUME = re.compile(r"^(data|config|ssl|addons|backup|share|media|homeassistant_config|all_addon_configs|"
                    r"addon_config)(?::(rw|ro))?$")
BUILD_IMAGE = re.compile(r"^([a-zA-Z\-\.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[\.\-\w{}]+)?$")
# one option's type: bool, email, url, port, device(subsystem=x), str/password/int/float with
# an optional (min,max), match(REGEX), list(a|b|c); a trailing "?" makes it optional
SCHEMA_ELEMENT = re.compile(
    r"^(?:|bool|email|url|port|device(?:\((?P<filter>subsystem=[a-z]+)\))?"
    r"|str(?:\((?P<s_min>\d+)?,(?P<s_max>\d+)?\))?"
    r"|password(?:\((?P<p_min>\d+)?,(?P<p_max>\d+)?\))?"
    r"|int(?:\((?P<i_min>\d+)?,(?P<i_max>\d+)?\))?"
    r"|float(?:\((?P<f_min>[\d\.]+)?,(?P<f_max>[\d\.]+)?\))?"
    r"|match\((?P<match>.*)\)|list\((?P<list>.+)\))\??$")
RANGE_GROUPS = ("i_min", "i_max", "f_min", "f_max", "s_min", "s_max", "p_min", "p_max")

network_port = vol.All(vol.Coerce(int), vol.Range(min=1, max=65535))
docker_ports = vol.Schema({vol.All(str, vol.Match(r"^\d+(?:/tcp|/udp)?$")): vol.Maybe(network_port)})

REPOSITORY = vol.Schema({vol.Required("name"): str, vol.Optional("url"): vol.Url(),
                         vol.Optional("maintainer"): str}, extra=vol.PREVENT_EXTRA)

ADDON = vol.Schema({
    vol.Required("name"): str,
    vol.Required("version"): str,  # any string AwesomeVersion takes; a quoted one here
    vol.Required("slug"): vol.Match(f"^{SLUG.pattern}$"),
    vol.Required("description"): str,
    vol.Required("arch"): [vol.In(ARCHITECTURES)],
    vol.Optional("url"): vol.Url(),
    vol.Optional("init"): vol.Boolean(),
    vol.Optional("ports"): docker_ports,
    vol.Optional("ports_description"): {vol.Match(r"^\d+(?:/tcp|/udp)?$"): str},
    vol.Optional("devices"): [str],
    vol.Optional("map"): [vol.Match(VOLUME)],
    vol.Optional("homeassistant_api"): vol.Boolean(),
    vol.Optional("discovery"): [str],
    vol.Optional("timeout"): vol.All(vol.Coerce(int), vol.Range(min=10, max=300)),
    vol.Optional("options"): dict,
    vol.Optional("schema"): {str: vol.Match(SCHEMA_ELEMENT)},
}, extra=vol.PREVENT_EXTRA)

BUILD = vol.Schema({
    vol.Optional("build_from"): vol.Any(vol.Match(BUILD_IMAGE), {vol.In(ARCHITECTURES): vol.Match(BUILD_IMAGE)}),
    vol.Optional("squash"): vol.Boolean(),
    vol.Optional("args"): {str: str},
    vol.Optional("labels"): {str: str},
}, extra=vol.PREVENT_EXTRA)

_TRANSLATED_OPTION = vol.Schema({vol.Required("name"): str, vol.Optional("description"): vol.Maybe(str)},
                                extra=vol.PREVENT_EXTRA)
TRANSLATIONS = vol.Schema({vol.Optional("configuration"): {str: _TRANSLATED_OPTION},
                           vol.Optional("network"): {str: str}}, extra=vol.PREVENT_EXTRA)


def addon_configs(files: list[str]) -> list[str]:
    """The add-on configs the Supervisor's store finds among a repository's `files` (paths
    relative to its root): `**/config.*` with a configuration suffix, nothing hidden, no rootfs."""
    found = []
    for name in files:
        path = PurePosixPath(name)
        if not (path.stem == "config" and path.suffix in CONFIG_SUFFIXES):
            continue
        if any(part.startswith(".") or part == "rootfs" for part in path.parts):
            continue
        found.append(name)
    return found


def repository_file(root: Path) -> Path | None:
    """The repository description the store reads: repository.{json,yaml,yml} at the root."""
    return next((root / f"repository{s}" for s in CONFIG_SUFFIXES if (root / f"repository{s}").is_file()), None)


def validate_options(schema: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
    """The options as the Supervisor saves them before a start; vol.Invalid when it would refuse
    to start the add-on."""
    valid = {name: _single(schema[name], value, name) for name, value in options.items() if name in schema}
    for name in set(schema) - set(valid):
        if not schema[name].endswith("?"):
            raise vol.Invalid(f"Missing option '{name}'")
    return valid


def _single(kind: str, value: Any, name: str) -> Any:
    if value is None:
        raise vol.Invalid(f"Missing required option '{name}'")
    match = SCHEMA_ELEMENT.match(kind)
    if not match:
        raise vol.Invalid(f"Unknown type '{kind}'")
    limits = {group[2:]: float(match.group(group)) for group in RANGE_GROUPS if match.group(group)}
    if kind.startswith("str"):
        return vol.All(str(value), vol.Range(**limits))(value)
    if kind.startswith("int"):
        return vol.All(vol.Coerce(int), vol.Range(**limits))(value)
    if kind.startswith("float"):
        return vol.All(vol.Coerce(float), vol.Range(**limits))(value)
    if kind.startswith("bool"):
        return vol.Boolean()(value)
    if kind.startswith("match"):
        return vol.Match(match.group("match"))(str(value))
    if kind.startswith("list"):
        return vol.In(match.group("list").split("|"))(str(value))
    raise vol.Invalid(f"type '{kind}' of option '{name}' is not one this add-on uses")
