"""Core ML for the Apple Neural Engine: a job's PyTorch model converted to an ML Program, and what it tells.

One concern per module:
    buckets       batch bucket sizes, padding a batch up to its bucket (numpy only)
    static        the model's static-shape form (its own static_module(), a registered rewrite, or itself)
    ane_bert      a BERT encoder rewritten after Apple's "Deploying Transformers on the Apple Neural Engine"
    convert       PyTorch -> .mlpackage (fp16, CPU_AND_NE, static shapes per bucket, fp32/int32 I/O), cached by hash
    package_info  a package read back from its spec: functions, shapes, dtypes, precision, ops (any OS)
    ane_notes     where a converted model is not Neural-Engine friendly, and why
    compute_plan  MLComputePlan: the share of a model's work on the ANE (macOS only; its summary is pure)

Conversion runs anywhere coremltools installs (Linux included, and tested there); predicting and compute plans need
macOS. Nothing here is imported by the agent daemon: the ane backend imports it in the Ray worker.
"""
