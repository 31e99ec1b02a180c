"""Validation of a JSON report against the schema the package ships (jsonschema, a test dependency)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from pytest_gpuready.plugin.report_document import SCHEMA_PATH


def validate(document: dict[str, Any]) -> None:
    """Fail with every schema error of ``document``, not only the first."""
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    assert errors == []
