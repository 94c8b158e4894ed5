"""Jobs: the declarative job spec (``spec``: schema, validation, canonical form, hash, job id).

The job lifecycle state machine lives beside it in this package; import submodules directly.
"""
