"""Farm's wire contract: the generated code in v1/ (never edited by hand) and conversions to the domain models."""
