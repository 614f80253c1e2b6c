"""The malicious-lender kit: what a lender, a local user or a fake head tried against Farm (issue 30), one test per
finding. Each failed on the code before its fix."""
