"""The names a tenant may take. The router keys its Redis counters and labels its
metrics by them, so they stay plain; the spec (builder/spec/tenants.py) refuses any other
name with this same pattern, read from here: the router owns the runtime fact, and its
stub cannot import the builder."""

from __future__ import annotations

import re

TENANT_NAME = r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}"
TENANT_RE = re.compile(TENANT_NAME)
