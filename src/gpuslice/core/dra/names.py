"""Which names from the wire (or from the checkpoint) the driver accepts.

A claim's UID becomes part of paths (the claim's MPS pipe directory, its CDI spec file), so a
UID holding `/` or `..` would reach outside the directory the agent owns. The kubelet's socket
is root-only and the claim is read back from the API, so this is defence in depth: every name
is checked where it enters, against the formats the API server itself enforces, and a name
that fails is refused with an error that quotes it.
"""

from __future__ import annotations

import re

from gpuslice.core.dra.kubelet_api import ClaimRef
from gpuslice.core.errors import GpusliceError

_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
"""The API server writes RFC 4122 UUIDs; tests and other clients write the same shape."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PATH_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class BadName(GpusliceError):
    """A name that cannot be used as given: the message names the field and the value."""


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def check_claim_uid(uid: str, field: str = "claim.uid") -> str:
    if not _UID.fullmatch(uid):
        raise BadName(f"{field} {_shown(uid)} is not a UID (8-4-4-4-12 hexadecimal digits)")
    return uid


def check_namespace(namespace: str, field: str = "claim.namespace") -> str:
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise BadName(
            f"{field} {_shown(namespace)} is not a namespace name (a DNS-1123 label: at "
            "most 63 lowercase letters, digits and '-', starting and ending alphanumeric)"
        )
    return namespace


def check_object_name(name: str, field: str = "claim.name") -> str:
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise BadName(
            f"{field} {_shown(name)} is not an object name (a DNS-1123 subdomain: at most 253 "
            "lowercase letters, digits, '-' and '.')"
        )
    return name


def check_claim_ref(ref: ClaimRef) -> ClaimRef:
    """The kubelet's reference to a claim, checked before any of it is used."""
    check_claim_uid(ref.uid)
    check_namespace(ref.namespace)
    check_object_name(ref.name)
    return ref


def check_path_component(value: str, field: str) -> str:
    """A name that becomes one directory or file name under a root the agent owns."""
    if not _PATH_COMPONENT.fullmatch(value):
        raise BadName(
            f"{field} {_shown(value)} cannot name a directory (letters, digits, '_', '.', '-'; "
            "at most 128; not starting with '.' or '-')"
        )
    return value
