"""``seqae cluster check-launcher FILE...``: refuse a cluster's config or IAM policy that still holds
the values a reader must replace (``cluster/aws.yaml``, ``cluster/aws-iam/*.json``,
``cluster/kuberay/*.yaml``).

Each such value is written ``REPLACE_ME_<WHAT>`` (an AMI, an account, a bucket), so that a file
copied without editing fails here, before ``ray up`` starts instances or ``aws iam`` creates roles,
with every placeholder named and where it is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from seqae_errors import ConfigError

PLACEHOLDER = re.compile(r"REPLACE_ME_[A-Z0-9_]+")


def placeholders(text: str) -> dict[str, list[int]]:
    """Each placeholder in ``text`` and the lines (from 1) that hold it."""
    found: dict[str, list[int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for name in PLACEHOLDER.findall(line):
            found.setdefault(name, []).append(number)
    return found


def check(path: Path) -> None:
    """Refuse ``path`` if it cannot be read as YAML (JSON for ``.json``) or still holds a placeholder."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        json.loads(text) if path.suffix == ".json" else list(yaml.safe_load_all(text))
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {str(exc).splitlines()[0]}"
        ) from None
    found = placeholders(text)
    if found:
        where = ", ".join(
            f"{name} (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"
            for name, lines in found.items()
        )
        raise ConfigError(f"{path} still holds placeholders: {where}; replace each with your own value")
