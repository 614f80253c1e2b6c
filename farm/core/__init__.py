"""The pure domain: models, job specs, errors. No I/O happens here."""
