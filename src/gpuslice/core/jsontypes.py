"""`Json`: a decoded JSON (or YAML) object as the API server and the files send it, before
it is checked. One alias for the package, so a reader greps one name."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
