"""Validates constrained generations against their schemas with Python's `jsonschema`.

usage: python validate_generated.py FILE   (FILE: [{"file", "schema", "text", "finish"}])
Exits 1 if any text is not JSON or does not validate; prints each failure.
"""

import json
import sys

import jsonschema

cases = json.load(open(sys.argv[1]))
bad = 0
for c in cases:
    try:
        instance = json.loads(c["text"])
        cls = jsonschema.validators.validator_for(c["schema"])
        cls(c["schema"], format_checker=cls.FORMAT_CHECKER).validate(instance)
    except Exception as e:  # noqa: BLE001 - any failure is reported
        bad += 1
        print(f"INVALID {c['file']} ({c['finish']}): {type(e).__name__}: {str(e)[:300]}\n  text: {c['text'][:300]!r}")
print(f"{len(cases) - bad} of {len(cases)} valid")
sys.exit(1 if bad else 0)
