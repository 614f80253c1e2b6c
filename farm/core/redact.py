"""Credentials written into a URL (`http://user:pass@host/...`) kept out of what Farm shows: job logs, errors and
explanations. README says to use the S3 and HTTP credential settings instead."""

from __future__ import annotations

import re

# scheme://userinfo@ — userinfo being anything up to the host without a slash, space or another @
USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """`text` with every URL's user and password replaced by `***`."""
    return USERINFO.sub(r"\g<scheme>***@", text)
